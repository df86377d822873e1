"""The shipped CNI configs: every file parses, follows libcni's rules (so upstream cnitool and
containerd load it) and is accepted by the plugins' own config parsers. The Kubernetes manifests are
checked in test_conf_k8s.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
K8S = CONF / "k8s"
MODES = {"global-router": "tke-bridge", "vpc-cni": "tke-route-eni"}
RDMA_LABEL = "feature.node.kubernetes.io/tke-shared-rdma"
RDMA_RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
ANNOTATION = "tke.cloud.tencent.com/networks"
# libcni 1.1 (Debian's cnitool) and containerd 1.6 load configs up to 1.0.0.
LIBCNI_VERSIONS = {"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"}


def cni_files() -> list[Path]:
    return sorted(p for p in CONF.rglob("*") if p.suffix in (".conf", ".conflist", ".json"))


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict), f"{path}: not a JSON object"
    return data


def libcni_problems(path: Path, data: dict[str, Any]) -> list[str]:
    """What libcni's ConfFromBytes / ConfListFromBytes would refuse (plus the version range)."""
    problems = []
    if data.get("cniVersion") not in LIBCNI_VERSIONS:
        problems.append(f"cniVersion {data.get('cniVersion')!r} not loadable by libcni 1.1 / containerd 1.6")
    name = data.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*", name):
        problems.append(f"name {data.get('name')!r} is not a valid network name")
    if path.suffix == ".conflist":
        plugins = data.get("plugins")
        if not isinstance(plugins, list) or not plugins:
            problems.append("a .conflist needs a non-empty 'plugins' list")
        else:
            problems += [f"plugins[{i}] has no 'type'" for i, p in enumerate(plugins) if not p.get("type")]
    elif not isinstance(data.get("type"), str) or not data["type"]:
        problems.append("a .conf needs a 'type'")
    for plugin in data.get("plugins", [data]):
        caps = plugin.get("capabilities", {})
        if not isinstance(caps, dict) or not all(isinstance(v, bool) for v in caps.values()):
            problems.append("capabilities must map names to booleans")
    return problems


def test_every_cni_file_parses_and_follows_libcni_rules() -> None:
    files = cni_files()
    assert len(files) == 5, files  # + conf/shared-mode/rdma-multus.d/tke-rdma-ipvlan.conf
    for path in files:
        assert libcni_problems(path, load(path)) == [], path


def test_libcni_check_refuses_broken_configs() -> None:
    good = load(CONF / "vpc-cni" / "00-rdma-multus.conflist")
    path = Path("x.conflist")
    for mutate in (
        lambda d: d.update(cniVersion="1.1.0"),
        lambda d: d.update(plugins=[]),
        lambda d: d["plugins"][0].pop("type"),
        lambda d: d.update(name="../x"),
        lambda d: d["plugins"][0].update(capabilities={"portMappings": "yes"}),
    ):
        bad = copy.deepcopy(good)
        mutate(bad)
        assert libcni_problems(path, bad), bad


@pytest.mark.parametrize("mode", sorted(MODES))
def test_meta_config_names_the_seed_default_network(mode: str) -> None:
    meta = load(CONF / mode / "00-rdma-multus.conflist")
    plugin = meta["plugins"][0]
    assert plugin["type"] == "rdma-multus"
    assert plugin["defaultDelegates"] == MODES[mode]
    assert plugin["annotation"] == ANNOTATION
    assert plugin["kubeletRootDir"] == "/var/lib/kubelet"
    # kubelet keeps device-plugins/ here whatever its --root-dir: install.sh moves only kubeletRootDir
    assert plugin["devicePluginDir"] == "/var/lib/kubelet/device-plugins"
    delegate = load(CONF / mode / "rdma-multus.d" / "tke-rdma-macvlan.conf")
    assert delegate["name"] == "tke-rdma-macvlan"
    assert delegate["type"] == "rdma-macvlan"
    assert Path(plugin["confDir"]).name == "rdma-multus.d"  # where install.sh puts the delegate


@pytest.mark.parametrize("mode", sorted(MODES))
def test_meta_config_is_accepted_by_rdma_multus(mode: str) -> None:
    multus_config = pytest.importorskip("rdma_cni.plugins.multus.config")
    cfg = multus_config.parse_config(load(CONF / mode / "00-rdma-multus.conflist")["plugins"][0])
    assert cfg.default_delegates == (MODES[mode],)
    assert cfg.annotation == ANNOTATION
    assert cfg.conf_dir == "/etc/cni/net.d/rdma-multus.d"
    assert cfg.kubelet_root_dir == "/var/lib/kubelet"
    assert cfg.pod_resources_dir == "/var/lib/kubelet/pod-resources"
    assert cfg.device_plugin_dir == "/var/lib/kubelet/device-plugins"


def _macvlan_parser() -> Any:
    for name in ("rdma_cni.plugins.macvlan.config", "rdma_cni.plugins.config"):
        try:
            return __import__(name, fromlist=["x"])
        except ImportError:
            continue
    pytest.skip("rdma-macvlan's config parser has not landed yet")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_delegate_config_is_accepted_by_rdma_macvlan(mode: str) -> None:
    module = _macvlan_parser()
    raw = load(CONF / mode / "rdma-multus.d" / "tke-rdma-macvlan.conf")
    parse = getattr(module, "parse_config", None) or module.MacvlanConfig.from_raw
    cfg = parse(raw)
    text = repr(cfg)
    assert "shared" in text and "/var/lib/cni/rdma-macvlan" in text, text


def test_delegate_config_uses_only_documented_keys() -> None:
    # DESIGN.md's table of rdma-macvlan keys, plus the CNI standard ones and resourceName (read by
    # rdma-multus to pass the pod's device IDs).
    documented = {
        "masters",
        "count",
        "mode",
        "mtu",
        "podIfName",
        "ipam",
        "rdma",
        "dataDir",
        "runDir",
        "sysfsRoot",
        "logFile",
        "logLevel",
        "cniVersion",
        "name",
        "type",
        "capabilities",
        "resourceName",
    }
    rdma_keys = {"netnsMode", "required", "gidIndex", "gidTimeoutMs"}
    for mode in MODES:
        raw = load(CONF / mode / "rdma-multus.d" / "tke-rdma-macvlan.conf")
        assert set(raw) <= documented, set(raw) - documented
        assert set(raw["rdma"]) <= rdma_keys
        assert raw["rdma"]["netnsMode"] == "shared" and raw["rdma"]["required"] is True


def test_shared_mode_delegate_config_is_accepted_by_rdma_ipvlan() -> None:
    from rdma_cni.plugins.ipvlan.config import parse_config

    raw = load(CONF / "shared-mode" / "rdma-multus.d" / "tke-rdma-ipvlan.conf")
    cfg, pools = parse_config(raw)
    assert (raw["name"], raw["type"]) == ("tke-rdma-ipvlan", "rdma-ipvlan")
    assert raw["resourceName"] == RDMA_RESOURCE  # Multus's convention: the shared pool it goes with
    assert (cfg.link, cfg.ipvlan_mode, cfg.rdma.required) == ("ipvlan", "l2", True)
    assert (cfg.data_dir, cfg.run_dir) == ("/var/lib/cni/rdma-ipvlan", "/run/rdma-cni")
    assert pools.ranges == {} and pools.exclude == []
