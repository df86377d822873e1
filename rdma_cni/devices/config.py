"""The device plugin's configuration: a YAML/JSON file, then command-line flags (flags win).

Every value is checked before the plugin touches a socket: a bad one stops the start with
:class:`ConfigError`, whose text is one sentence naming the key, the bad value and the fix. The
bonds to advertise (``masters``) and the state directories (``dataDir``, ``runDir``) are not the
plugin's own settings: they come from the node's ``tke-rdma-macvlan`` config at ``cni_conf``, read
with the CNI plugin's own (pydantic-free) reader, so the device plugin and the CNI plugin can never
disagree on which bonds exist. A missing ``cni_conf`` means what it means to rdma-macvlan: every
netdev that backs an RDMA device, default directories.

File keys are camelCase (as in the CNI configs); flag keys are the :class:`PluginConfig` field
names (what ``argparse`` gives for ``--kubelet-root-dir``); a flag whose value is ``None`` was not
given::

    resourceName: tke.cloud.tencent.com/tke-shared-rdma
    kubeletRootDir: /var/lib/kubelet
    rescanIntervalSeconds: 0.5
    env: {NCCL_IB_HCA: true, NCCL_IB_GID_INDEX: true, UCX_NET_DEVICES: true, UCX_IB_GID_INDEX: true}

    cfg = load_config({"sysfs_root": "/tmp/sys"}, "/etc/rdma-cni/device-plugin.yaml")
    require_shared_netns(cfg)      # NetnsModeError when the kernel's RDMA netns mode is exclusive
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from rdma_cni.cni.errors import CniError
from rdma_cni.delegate_config import DEFAULT_RUN_DIR, parse_status_config
from rdma_cni.devices import poolconf
from rdma_cni.devices.errors import ConfigError as ConfigError  # re-exported: callers know it here
from rdma_cni.devices.pools import DEFAULT_SHARED_COUNT, EXCLUSIVE, MODES, SHARED, PoolSpec
from rdma_cni.rdma import mode as rdma_mode

log = logging.getLogger("rdma_cni.deviceplugin")

DEFAULT_RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
DEFAULT_CNI_CONF = "/etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf"
DEFAULT_DATA_DIR = "/var/lib/cni/rdma-macvlan"  # rdma-macvlan's own defaults (plugins/macvlan/config.py)
# The CNI plugins whose delegate config --cni-conf may name, and each one's default dataDir.
CNI_DATA_DIRS = {"rdma-macvlan": DEFAULT_DATA_DIR, "rdma-ipvlan": "/var/lib/cni/rdma-ipvlan"}
DEFAULT_LOG_FILE = "/var/log/rdma-cni/rdma-device-plugin.log"
DEFAULT_DEVICE_INFO_DIR = "/var/run/k8s.cni.cncf.io/devinfo/dp"  # where upstream Multus looks (hard-coded)
LOG_LEVELS = ("debug", "info", "warning", "error")
# Below 50 ms a rescan of 8 bonds is a noticeable share of a core; above 60 s the port state (which
# has no netlink event) would reach kubelet far later than the 1 s the product promises.
RESCAN_MIN_S = 0.05
RESCAN_MAX_S = 60.0
ENV_NAMES = ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "UCX_NET_DEVICES", "UCX_IB_GID_INDEX")


class NetnsModeError(ConfigError):
    """The kernel's RDMA netns mode is not ``shared``: every pod would see no RDMA device at all
    (exclusive mode moves a device into one netns), so the plugin refuses to advertise any."""


@dataclass(frozen=True)
class PluginConfig:
    """Everything the plugin runs with, validated. Field names are the flag keys."""

    resource_name: str = DEFAULT_RESOURCE
    kubelet_root_dir: str = DEFAULT_KUBELET_ROOT
    device_plugin_dir: str = os.path.join(DEFAULT_KUBELET_ROOT, "device-plugins")
    pod_resources_dir: str = os.path.join(DEFAULT_KUBELET_ROOT, "pod-resources")
    sysfs_root: str = "/sys"
    dev_root: str = "/dev"
    cni_conf: str = DEFAULT_CNI_CONF
    masters: tuple[str, ...] | None = None  # from cni_conf; None: every netdev backing an RDMA device
    data_dir: str = DEFAULT_DATA_DIR  # from cni_conf (rdma-macvlan's attachment records)
    run_dir: str = DEFAULT_RUN_DIR  # from cni_conf (GID records; the plugin's status file)
    rescan_interval_s: float = 0.5
    env_nccl_ib_hca: bool = True
    env_nccl_ib_gid_index: bool = True
    env_ucx_net_devices: bool = True
    env_ucx_ib_gid_index: bool = True
    log_file: str = DEFAULT_LOG_FILE
    log_level: str = "info"
    mode: str = EXCLUSIVE  # the one pool's mode when no pools are listed (TKE's ``mode: shared``)
    shared_count: int = DEFAULT_SHARED_COUNT
    pools: tuple[PoolSpec, ...] = ()  # ``pools:`` or Mellanox's ``configList``; () = the one pool
    device_info_dir: str = DEFAULT_DEVICE_INFO_DIR  # NPWG device-info files for Multus; "" = none

    def pool_specs(self) -> tuple[PoolSpec, ...]:
        """The pools to serve: those listed, else the one named ``resource_name`` over the bonds of
        ``masters`` (exclusive: today's plugin; ``mode: shared``: TKE's shared mode)."""
        if self.pools:
            return self.pools
        count = self.shared_count if self.mode == SHARED else 0
        return (PoolSpec(self.resource_name, self.mode, count, None, "resourceName"),)


# --- keys: file name, flag name, how to check, what to say ---------------------------------------

Checker = Callable[[object], object]  # returns the clean value or raises ValueError


@dataclass(frozen=True)
class Key:
    field: str
    file_key: str
    check: Checker
    fix: str


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _resource_name(value: object) -> str:
    """kubelet's rule for an extended resource (``IsExtendedResourceName``): ``domain/name``, the
    domain a DNS subdomain outside ``kubernetes.io``, and ``requests.<domain>/<name>`` a valid
    qualified name (prefix at most 253 characters, name at most 63)."""
    if not isinstance(value, str) or value.count("/") != 1:
        raise ValueError
    domain, name = value.split("/")
    if not _DNS_SUBDOMAIN.fullmatch(domain) or len("requests." + domain) > 253:
        raise ValueError
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ValueError
    if not _NAME.fullmatch(name) or len(name) > 63:
        raise ValueError
    return value


def _abs_path(value: object) -> str:
    if not isinstance(value, str) or not os.path.isabs(value) or "\0" in value:
        raise ValueError
    return os.path.normpath(value)


def _abs_path_or_off(value: object) -> str:
    return "" if value == "" else _abs_path(value)


def _existing_dir(value: object) -> str:
    path = _abs_path(value)
    if not os.path.isdir(path):
        raise ValueError
    return path


def _log_file(value: object) -> str:
    if value == "":
        return ""
    return _abs_path(value)


def _log_level(value: object) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise ValueError
    return value.lower()


def _interval(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError
    seconds = float(value)
    if not RESCAN_MIN_S <= seconds <= RESCAN_MAX_S:  # also refuses NaN
        raise ValueError
    return seconds


def _mode(value: object) -> str:
    if value not in MODES:
        raise ValueError
    return str(value)


def _shared_count(value: object) -> int:
    try:
        return poolconf.count(value, "sharedCount", "")
    except ConfigError:
        raise ValueError from None


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError
    return value


_DIR_FIX = "use an absolute directory path"
KEYS = (
    Key("resource_name", "resourceName", _resource_name,
        f"use an extended resource name 'domain/name' outside kubernetes.io, for example {DEFAULT_RESOURCE}"),
    Key("kubelet_root_dir", "kubeletRootDir", _abs_path,
        f"{_DIR_FIX}: kubelet's --root-dir, normally {DEFAULT_KUBELET_ROOT}"),
    Key("device_plugin_dir", "devicePluginDir", _abs_path,
        f"{_DIR_FIX} holding kubelet.sock, normally {DEFAULT_KUBELET_ROOT}/device-plugins"),
    Key("pod_resources_dir", "podResourcesDir", _abs_path,
        f"{_DIR_FIX} holding kubelet's pod-resources socket, normally <kubeletRootDir>/pod-resources"),
    Key("sysfs_root", "sysfsRoot", _existing_dir, "use an existing absolute directory, normally /sys"),
    Key("dev_root", "devRoot", _existing_dir,
        "use an existing absolute directory holding infiniband/uverbsN, normally /dev"),
    Key("cni_conf", "cniConf", _abs_path,
        f"use the absolute path of the tke-rdma-macvlan config, normally {DEFAULT_CNI_CONF}"),
    Key("data_dir", "dataDir", _abs_path,
        f"{_DIR_FIX}, or leave it out to use the tke-rdma-macvlan config's dataDir"),
    Key("run_dir", "runDir", _abs_path,
        f"{_DIR_FIX}, or leave it out to use the tke-rdma-macvlan config's runDir"),
    Key("rescan_interval_s", "rescanIntervalSeconds", _interval,
        f"use a number of seconds from {RESCAN_MIN_S} to {RESCAN_MAX_S:g}, for example 0.5 "
        "(the port state has no event: this bounds how late a port going down reaches kubelet)"),
    Key("env_nccl_ib_hca", "env.NCCL_IB_HCA", _bool, "use true or false (a YAML/JSON boolean)"),
    Key("env_nccl_ib_gid_index", "env.NCCL_IB_GID_INDEX", _bool, "use true or false (a YAML/JSON boolean)"),
    Key("env_ucx_net_devices", "env.UCX_NET_DEVICES", _bool, "use true or false (a YAML/JSON boolean)"),
    Key("env_ucx_ib_gid_index", "env.UCX_IB_GID_INDEX", _bool, "use true or false (a YAML/JSON boolean)"),
    Key("device_info_dir", "deviceInfoDir", _abs_path_or_off,
        f'{_DIR_FIX} for NPWG device-info files, normally {DEFAULT_DEVICE_INFO_DIR} (where Multus '
        'reads them), or "" to write none'),
    Key("log_file", "logFile", _log_file, 'use an absolute file path, or "" for stderr only'),
    Key("log_level", "logLevel", _log_level, "use one of debug, info, warning, error"),
    Key("mode", "mode", _mode, "use exclusive (one device per RDMA bond, the default) or shared "
        "(TKE's shared mode: sharedCount virtual devices, every pod gets every bond's HCA)"),
    Key("shared_count", "sharedCount", _shared_count, f"use a whole number from 1 to {poolconf.MAX_COUNT}: "
        f"how many pods may share the bonds at once (default {DEFAULT_SHARED_COUNT})"),
)
_BY_FIELD = {k.field: k for k in KEYS}
_BY_FILE_KEY = {k.file_key: k for k in KEYS}
_FIELDS = {f.name for f in fields(PluginConfig)}


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


# --- loading ---------------------------------------------------------------------------------------


def load_config(flags: Mapping[str, object], config_file: str | None) -> PluginConfig:
    """The validated configuration: defaults < ``config_file`` < ``flags`` (``None`` = not given);
    then ``masters``/``dataDir``/``runDir`` from the ``tke-rdma-macvlan`` config at ``cni_conf``
    (``data_dir``/``run_dir`` set here win over it). Raises :class:`ConfigError`."""
    clean: dict[str, object] = {}
    if config_file is not None:  # checked even where a flag overrides it: a bad file is a bad file
        for name, value in _read_file(config_file).items():
            clean[name] = value if name == "pools" else _checked(name, value, config_file)  # pools: checked
    for name, value in flags.items():
        if name not in _BY_FIELD:
            raise ConfigError(flag_name(name), value, f"it is not an option; known: {_known_flags()}")
        if value is not None:
            clean[name] = _checked(name, value, "")
    _one_form(clean, config_file or "")
    root = str(clean.get("kubelet_root_dir", DEFAULT_KUBELET_ROOT))
    clean.setdefault("device_plugin_dir", os.path.join(root, "device-plugins"))
    clean.setdefault("pod_resources_dir", os.path.join(root, "pod-resources"))
    cni_conf = str(clean.get("cni_conf", DEFAULT_CNI_CONF))
    masters, data_dir, run_dir = read_cni_conf(cni_conf)
    clean.setdefault("data_dir", data_dir)
    clean.setdefault("run_dir", run_dir)
    clean["masters"] = masters
    return PluginConfig(**clean)  # type: ignore[arg-type]


def _one_form(clean: Mapping[str, object], where: str) -> None:
    """A pool list names its own resources and modes: resourceName/mode/sharedCount beside it (in the
    file or as a flag) would be ignored, so they are refused instead."""
    if not clean.get("pools"):
        if "shared_count" in clean and clean.get("mode") != SHARED:
            raise ConfigError("sharedCount", clean["shared_count"], "it counts the pool of mode: shared; add "
                              "mode: shared or leave sharedCount out", where)
        return
    for name in ("resource_name", "mode", "shared_count"):
        if name in clean:
            raise ConfigError(_BY_FIELD[name].file_key + " / " + flag_name(name), clean[name],
                              "the config lists pools, each with its own resourceName and mode: drop this "
                              "setting or put it on a pool", where)


def _checked(name: str, value: object, where: str) -> object:
    key = _BY_FIELD[name]
    try:
        return key.check(value)
    except ValueError:
        raise ConfigError(key.file_key if where else flag_name(name), value, key.fix, where) from None


def _known_flags() -> str:
    return ", ".join(flag_name(k.field) for k in KEYS)


def _read_file(path: str) -> dict[str, object]:
    """File keys -> field names; the file itself must exist and hold one mapping."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError("--config", path, f"the file cannot be read ({exc.strerror}); "
                          "give an existing YAML or JSON file, or leave --config out") from None
    data = _parse(path, text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("--config", path, "the file must hold one mapping of keys, like 'logLevel: info'")
    if "configList" in data:  # Mellanox's k8s-rdma-shared-dev-plugin config.json, as it is
        return {"pools": poolconf.parse_mellanox(data, path, _resource_name)}
    out: dict[str, object] = {}
    for key, value in data.items():
        if key == "pools":
            out["pools"] = poolconf.parse_pools(value, path, _resource_name)
            continue
        if key == "env":
            out.update(_env_section(path, value))
            continue
        spec = _BY_FILE_KEY.get(str(key))
        if spec is None or "." in str(key):
            raise ConfigError(str(key), value, _unknown_fix(str(key)), path)
        out[spec.field] = value
    return out


def _parse(path: str, text: str) -> Any:
    """JSON when it reads as JSON (a ``.json`` file must), else YAML: told by the content, so a
    ConfigMap's ``config.json`` mounted under any name works. YAML reads JSON too, but JSON's own
    errors say more."""
    try:
        return json.loads(text)
    except ValueError as exc:
        if path.endswith(".json"):
            raise ConfigError("--config", path, f"it is not valid JSON ({exc}); fix the syntax") from None
    import yaml  # only when a YAML file is given: the import costs ~10 ms

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError("--config", path, f"it is not valid YAML{line}; fix the syntax") from None


def _env_section(path: str, value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ConfigError("env", value, "use a mapping of variable name to true/false, "
                          "for example env: {NCCL_IB_GID_INDEX: false}", path)
    out: dict[str, object] = {}
    for name, switch in value.items():
        spec = _BY_FILE_KEY.get(f"env.{name}")
        if spec is None:
            raise ConfigError(f"env.{name}", switch, f"the plugin sets only {', '.join(ENV_NAMES)}", path)
        out[spec.field] = switch
    return out


def _unknown_fix(key: str) -> str:
    close = difflib.get_close_matches(key, [*_BY_FILE_KEY, "env", "pools", "configList"], n=1)
    hint = f" (did you mean {close[0]})" if close else ""
    return f"it is not a device plugin setting{hint}; known keys: " + ", ".join(
        [k for k in _BY_FILE_KEY if not k.startswith("env.")] + ["env", "pools", "configList"]
    )


def read_cni_conf(path: str) -> tuple[tuple[str, ...] | None, str, str]:
    """``(masters, dataDir, runDir)`` of the rdma-macvlan config, checked by the CNI plugin's own
    reader (the one its STATUS uses, without pydantic). Absent file: ``(None, defaults)``."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        log.info("%s not found: advertising every netdev that backs an RDMA device", path)
        return None, DEFAULT_DATA_DIR, DEFAULT_RUN_DIR
    except (OSError, ValueError) as exc:
        raise ConfigError("--cni-conf", path, f"the tke-rdma-macvlan config cannot be read ({exc}); "
                          "fix the file, or point --cni-conf at the node's config") from None
    if not isinstance(raw, dict):
        raise ConfigError("--cni-conf", path, "the tke-rdma-macvlan config must be a JSON object")
    plugin = raw.get("type", "rdma-macvlan")
    if plugin not in CNI_DATA_DIRS:
        raise ConfigError("type", plugin, "--cni-conf must name the node's tke-rdma-macvlan (exclusive) or "
                          "tke-rdma-ipvlan (shared) delegate config", path)
    try:  # rdma-ipvlan's masters, dataDir and runDir are rdma-macvlan's keys: one reader checks both
        status = parse_status_config(raw, CNI_DATA_DIRS[str(plugin)])
    except CniError as exc:
        raise ConfigError("--cni-conf", path, f"{plugin} refuses it too: {exc.msg}") from None
    run_dir = raw.get("runDir", DEFAULT_RUN_DIR)
    if not isinstance(run_dir, str) or not os.path.isabs(run_dir):
        raise ConfigError("runDir", run_dir, "use an absolute directory path", path)
    masters = tuple(status.masters) if status.masters is not None else None
    return masters, status.data_dir, run_dir


# --- preflight -------------------------------------------------------------------------------------


def require_shared_netns(cfg: PluginConfig) -> str | None:
    """Refuse (:class:`NetnsModeError`) when the kernel's RDMA netns mode is not ``shared``.

    Returns the mode, or None when it cannot be told yet (no RDMA core loaded: the driver may load
    after the plugin starts; the plugin then advertises what it finds and this is logged).
    """
    try:
        current = rdma_mode.current_netns_mode(cfg.sysfs_root)
    except CniError as exc:
        log.warning("cannot tell the kernel RDMA netns mode yet: %s (%s)", exc.msg, exc.details)
        return None
    if current != rdma_mode.SHARED:
        raise NetnsModeError(
            "kernel RDMA netns mode", current,
            "a shared RDMA device plugin needs 'shared' (in exclusive mode a pod sees only devices moved "
            f"into its netns); {rdma_mode.FIX_SHARED}",
        )
    return current
