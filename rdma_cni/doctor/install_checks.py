"""Is rdma-cni installed the way the runtime will use it: the plugin binaries in the CNI bin dir, the
config the runtime picks (the first file in the conf dir), the tke-rdma-macvlan delegate config (on a
shared-mode node, which has none, rdma-ipvlan's) and the default network rdma-multus delegates to.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rdma_cni.cni import conflist
from rdma_cni.cni.errors import CniError
from rdma_cni.doctor.findings import FAIL, OK, WARN, Finding
from rdma_cni.doctor.node import DELEGATE_NAME, DELEGATE_SUBDIR, META_NAME, NodeSnapshot
from rdma_cni.doctor.shared_pools import find_config
from rdma_cni.plugins.ipvlan import config as ipvlan_config
from rdma_cni.plugins.macvlan import config as macvlan_config

PLUGINS = ("rdma-macvlan", "rdma-multus")
SHARED_PLUGIN = "rdma-ipvlan"  # checked too where an rdma-ipvlan network is installed (shared mode)
CONFIG_EXTENSIONS = (".conf", ".conflist", ".json")


def check_binaries(snap: NodeSnapshot) -> list[Finding]:
    out = []
    bin_dir = snap.paths.cni_bin_dir
    shared = _shared_config(snap.paths.conf_dir) is not None
    for name in (*PLUGINS, *((SHARED_PLUGIN,) if shared else ())):
        path = os.path.join(bin_dir, name)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            out.append(
                Finding(
                    f"binary {name}",
                    FAIL,
                    f"{path} is missing or not executable",
                    f"install.sh --cni-bin-dir {bin_dir} (from the bundle scripts/build makes)",
                )
            )
            continue
        out.append(Finding(f"binary {name}", OK, f"{path}{_build_id(path)}"))
    return out


def _build_id(path: str) -> str:
    try:
        with open(os.path.join(os.path.dirname(os.path.realpath(path)), "BUILD_ID")) as f:
            return f" (build {f.read().strip()})"
    except OSError:
        return ""


def _config_files(conf_dir: str) -> list[str]:
    try:
        names = sorted(os.listdir(conf_dir))
    except OSError:
        return []
    return [n for n in names if n.endswith(CONFIG_EXTENSIONS) and os.path.isfile(os.path.join(conf_dir, n))]


def _load_json(path: str) -> dict[str, Any]:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _first_type(conf: dict[str, Any]) -> str:
    plugins = conf.get("plugins")
    if isinstance(plugins, list) and plugins and isinstance(plugins[0], dict):
        return str(plugins[0].get("type", "?"))
    return str(conf.get("type", "?"))


def check_configs(snap: NodeSnapshot) -> list[Finding]:
    conf_dir = snap.paths.conf_dir
    files = _config_files(conf_dir)
    if not files:
        return [
            Finding(
                "runtime-config",
                FAIL,
                f"no CNI config in {conf_dir}: pods get no network",
                f"install.sh --conf-dir {conf_dir} --mode vpc-cni|global-router",
            )
        ]
    out = [_runtime_config(conf_dir, files)]
    meta = _meta_plugin(conf_dir, files)
    out.append(_delegate_finding(snap))
    if meta is not None:
        out += _default_delegates(conf_dir, meta)
    return out


def _runtime_config(conf_dir: str, files: list[str]) -> Finding:
    first = files[0]
    try:
        kind = _first_type(_load_json(os.path.join(conf_dir, first)))
    except (OSError, ValueError) as exc:
        return Finding(
            "runtime-config",
            FAIL,
            f"{first} (the runtime's network) is unreadable: {exc}",
            f"fix or remove {os.path.join(conf_dir, first)}",
        )
    if kind == "rdma-multus":
        return Finding("runtime-config", OK, f"the runtime uses {first} (rdma-multus)")
    where = "sorts after it" if META_NAME in files else "is not installed"
    return Finding(
        "runtime-config",
        WARN,
        f"the runtime uses {first} ({kind}); {META_NAME} {where}",
        "fine if that meta plugin already runs tke-rdma-macvlan for the pod annotation; else "
        "install.sh --mode vpc-cni|global-router and make 00-rdma-multus.conflist sort first",
    )


def _meta_plugin(conf_dir: str, files: list[str]) -> dict[str, Any] | None:
    if META_NAME not in files:
        return None
    try:
        plugins = _load_json(os.path.join(conf_dir, META_NAME)).get("plugins")
    except (OSError, ValueError):
        return None
    return plugins[0] if isinstance(plugins, list) and plugins and isinstance(plugins[0], dict) else None


def _delegate_finding(snap: NodeSnapshot) -> Finding:
    path = os.path.join(snap.paths.conf_dir, DELEGATE_SUBDIR, f"{DELEGATE_NAME}.conf")
    name = f"config {DELEGATE_NAME}"
    shared = None if os.path.exists(path) else _shared_config(snap.paths.conf_dir)
    if shared is not None:
        return _shared_delegate_finding(*shared)
    try:
        raw = _load_json(path)
        cfg = macvlan_config.parse_config(raw)
    except OSError:
        return Finding(
            name,
            FAIL,
            f"{path} is missing: the annotation's tke-rdma-macvlan network has no config",
            f"install.sh --conf-dir {snap.paths.conf_dir}",
        )
    except ValueError as exc:
        return Finding(name, FAIL, f"{path} is not valid JSON: {exc}", "reinstall it with install.sh")
    except CniError as exc:
        return Finding(name, FAIL, f"{path}: {exc.msg}", "fix the key named, or reinstall with install.sh")
    if raw.get("type") != "rdma-macvlan":
        return Finding(name, FAIL, f"{path} has type {raw.get('type')!r}", "its type must be rdma-macvlan")
    return Finding(name, OK, f"{path}: rdma.netnsMode {cfg.rdma.netns_mode}, dataDir {cfg.data_dir}")


def _shared_config(conf_dir: str) -> tuple[str, dict[str, Any]] | None:
    return find_config(conf_dir)


def _shared_delegate_finding(path: str, raw: dict[str, Any]) -> Finding:
    """A shared-mode node: rdma-ipvlan's network in place of tke-rdma-macvlan's, read as the plugin
    reads it (a bad key is the plugin's own error 7 message)."""
    name = f"config {raw.get('name') or SHARED_PLUGIN}"
    try:
        cfg, _ = ipvlan_config.parse_config(raw)
    except CniError as exc:
        return Finding(name, FAIL, f"{path}: {exc.msg}", "fix the key named, or reinstall with install.sh")
    return Finding(name, OK, f"{path}: shared mode, link {cfg.link}, dataDir {cfg.data_dir}")


def _default_delegates(conf_dir: str, meta: dict[str, Any]) -> list[Finding]:
    names = meta.get("defaultDelegates", "")
    wanted = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names or [])
    delegate_dir = os.path.join(conf_dir, DELEGATE_SUBDIR)
    out = []
    for name in (n for n in wanted if n):
        try:
            net = conflist.load(delegate_dir, name)
        except CniError as exc:
            out.append(
                Finding(
                    f"default-network {name}",
                    FAIL,
                    f"rdma-multus's default network has no usable config in {delegate_dir}: {exc.msg}",
                    f'put the cluster network\'s config ("name": "{name}") into {delegate_dir}, '
                    "or install.sh with the --mode that matches the cluster",
                )
            )
            continue
        types = ",".join(str(p.get("type")) for p in net.plugins)
        out.append(Finding(f"default-network {name}", OK, f"found in {delegate_dir} ({types})"))
    return out
