"""The device plugin's configuration: file (YAML/JSON) then flags, every bad value one sentence that
names the key, the value and the fix; masters/dataDir/runDir from the tke-rdma-macvlan config;
refusal when the kernel's RDMA netns mode is not shared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rdma_cni.devices.config import (
    DEFAULT_RESOURCE,
    ConfigError,
    NetnsModeError,
    PluginConfig,
    load_config,
    require_shared_netns,
)
from rdma_cni.sim import tree


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Any]:
    """Existing sysfs/dev roots and an absent cni conf: a config that loads as given."""
    (tmp_path / "sys").mkdir()
    (tmp_path / "dev").mkdir()
    return {"sysfs_root": str(tmp_path / "sys"), "dev_root": str(tmp_path / "dev"),
            "cni_conf": str(tmp_path / "absent.conf")}


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_follow_the_kubelet_root_dir(roots: dict[str, Any]) -> None:
    cfg = load_config({**roots, "kubelet_root_dir": "/data/kubelet"}, None)
    assert cfg.resource_name == DEFAULT_RESOURCE
    assert (cfg.device_plugin_dir, cfg.pod_resources_dir) == ("/data/kubelet/device-plugins",
                                                              "/data/kubelet/pod-resources")
    assert (cfg.masters, cfg.data_dir, cfg.run_dir) == (None, "/var/lib/cni/rdma-macvlan", "/run/rdma-cni")
    assert cfg.rescan_interval_s == 0.5 and cfg.env_nccl_ib_gid_index and cfg.log_level == "info"


def test_yaml_file_then_flags_win(roots: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, "dp.yaml", """\
# the DaemonSet's ConfigMap
resourceName: example.com/rdma
rescanIntervalSeconds: 0.25
devicePluginDir: /var/lib/kubelet/device-plugins
env:
  NCCL_IB_GID_INDEX: false
  UCX_NET_DEVICES: false
logLevel: DEBUG
""")
    cfg = load_config({**roots, "resource_name": None, "rescan_interval_s": 2}, path)
    assert cfg.resource_name == "example.com/rdma"  # None = flag not given: the file's value stays
    assert cfg.rescan_interval_s == 2.0
    assert (cfg.env_nccl_ib_gid_index, cfg.env_ucx_net_devices, cfg.env_nccl_ib_hca) == (False, False, True)
    assert cfg.log_level == "debug"


def test_json_file_is_read_too(roots: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, "dp.json", json.dumps({"env": {"NCCL_IB_HCA": False}, "logFile": ""}))
    cfg = load_config(roots, path)
    assert (cfg.env_nccl_ib_hca, cfg.log_file) == (False, "")


def test_a_yaml_flow_mapping_is_yaml_not_broken_json(roots: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, "dp.yaml", "{logLevel: warning, env: {UCX_IB_GID_INDEX: false}}\n")
    cfg = load_config(roots, path)
    assert (cfg.log_level, cfg.env_ucx_ib_gid_index) == ("warning", False)


def test_masters_and_dirs_come_from_the_cni_conf(roots: dict[str, Any], tmp_path: Path) -> None:
    conf = write(tmp_path, "tke-rdma-macvlan.conf", json.dumps({
        "cniVersion": "1.0.0", "name": "tke-rdma-macvlan", "type": "rdma-macvlan",
        "masters": ["bond0", "bond2"], "dataDir": "/var/lib/x", "runDir": "/run/x"}))
    cfg = load_config({**roots, "cni_conf": conf}, None)
    assert (cfg.masters, cfg.data_dir, cfg.run_dir) == (("bond0", "bond2"), "/var/lib/x", "/run/x")
    cfg = load_config({**roots, "cni_conf": conf, "run_dir": "/tmp/dp-run"}, None)
    assert cfg.run_dir == "/tmp/dp-run"  # set explicitly: wins over the CNI config


BAD_FLAGS = [
    ("resource_name", "tke-shared-rdma", "--resource-name", "domain/name"),
    ("resource_name", "kubernetes.io/rdma", "--resource-name", "outside kubernetes.io"),
    ("resource_name", "Tke.Cloud/rdma", "--resource-name", "domain/name"),
    ("resource_name", "tke.cloud.tencent.com/" + "x" * 64, "--resource-name", "domain/name"),
    ("resource_name", "a/b/c", "--resource-name", "domain/name"),
    ("kubelet_root_dir", "var/lib/kubelet", "--kubelet-root-dir", "absolute directory"),
    ("device_plugin_dir", "", "--device-plugin-dir", "absolute directory"),
    ("pod_resources_dir", 7, "--pod-resources-dir", "absolute directory"),
    ("sysfs_root", "/nonexistent/sys", "--sysfs-root", "existing absolute directory"),
    ("dev_root", "dev", "--dev-root", "existing absolute directory"),
    ("cni_conf", "tke-rdma-macvlan.conf", "--cni-conf", "absolute path"),
    ("rescan_interval_s", 0, "--rescan-interval-s", "0.05 to 60"),
    ("rescan_interval_s", -1.5, "--rescan-interval-s", "0.05 to 60"),
    ("rescan_interval_s", 3600, "--rescan-interval-s", "0.05 to 60"),
    ("rescan_interval_s", float("nan"), "--rescan-interval-s", "0.05 to 60"),
    ("rescan_interval_s", "0.5", "--rescan-interval-s", "0.05 to 60"),
    ("rescan_interval_s", True, "--rescan-interval-s", "0.05 to 60"),
    ("env_nccl_ib_hca", "yes", "--env-nccl-ib-hca", "true or false"),
    ("env_ucx_ib_gid_index", 1, "--env-ucx-ib-gid-index", "true or false"),
    ("log_file", "rdma.log", "--log-file", "absolute file path"),
    ("log_level", "verbose", "--log-level", "debug, info, warning, error"),
    ("log_level", None, None, None),  # None: not given, default kept
    ("masters", ["bond0"], "--masters", "not an option"),
]


@pytest.mark.parametrize(("field", "value", "key", "fix"), BAD_FLAGS)
def test_every_bad_flag_is_one_sentence_naming_key_value_and_fix(
    roots: dict[str, Any], field: str, value: object, key: str | None, fix: str | None
) -> None:
    if key is None:
        assert load_config({**roots, field: value}, None).log_level == "info"
        return
    with pytest.raises(ConfigError) as err:
        load_config({**roots, field: value}, None)
    text = str(err.value)
    assert text.startswith(f"{key} = {value!r} is invalid: ")
    assert fix is not None and fix in text
    assert text.endswith(".") and text.count(". ") == 0 and "\n" not in text  # one sentence
    assert (err.value.key, err.value.value) == (key, value)


BAD_FILES = [
    ("resourceName: foo\n", "resourceName", "domain/name"),
    ("rescanIntervalSeconds: fast\n", "rescanIntervalSeconds", "0.05 to 60"),
    ("rescanInterval: 1\n", "rescanInterval", "did you mean rescanIntervalSeconds"),
    ("logLevel: loud\n", "logLevel", "debug, info"),
    ("env:\n  NCCL_IB_HCA: 'true'\n", "env.NCCL_IB_HCA", "true or false"),
    ("env:\n  NCCL_DEBUG: true\n", "env.NCCL_DEBUG", "only NCCL_IB_HCA"),
    ("env: [NCCL_IB_HCA]\n", "env", "mapping of variable name"),
    ("sysfsRoot: /nonexistent\n", "sysfsRoot", "existing absolute directory"),
    ("masters: [bond0]\n", "masters", "not a device plugin setting"),
    ("- resourceName\n", "--config", "one mapping"),
    ("resourceName: [unclosed\n", "--config", "not valid YAML at line"),
    ("logLevel: [a, b\n", "--config", "not valid YAML"),
]


def test_a_broken_json_file_says_json(roots: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, "dp.json", '{"logLevel": }')
    with pytest.raises(ConfigError) as err:
        load_config(roots, path)
    assert err.value.key == "--config" and "not valid JSON" in str(err.value) and path in str(err.value)


@pytest.mark.parametrize(("text", "key", "fix"), BAD_FILES)
def test_every_bad_file_value_names_the_key_and_the_file(
    roots: dict[str, Any], tmp_path: Path, text: str, key: str, fix: str
) -> None:
    path = write(tmp_path, "dp.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_config(roots, path)
    msg = str(err.value)
    assert err.value.key == key and msg.startswith(f"{key} ") and fix in msg, msg
    assert path in msg and "\n" not in msg


def test_a_missing_config_file_is_an_error(roots: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(roots, str(tmp_path / "nope.yaml"))
    assert err.value.key == "--config" and "cannot be read" in str(err.value)


def test_a_cni_conf_rdma_macvlan_refuses_is_refused_here_too(roots: dict[str, Any], tmp_path: Path) -> None:
    conf = write(tmp_path, "bad.conf", json.dumps({"masters": "bond0"}))
    with pytest.raises(ConfigError) as err:
        load_config({**roots, "cni_conf": conf}, None)
    assert err.value.key == "--cni-conf" and "masters" in str(err.value)
    conf = write(tmp_path, "torn.conf", '{"masters": ["bond0"')
    with pytest.raises(ConfigError) as err:
        load_config({**roots, "cni_conf": conf}, None)
    assert "cannot be read" in str(err.value)


def test_exclusive_netns_mode_is_refused_with_the_fix(tmp_path: Path) -> None:
    root = str(tmp_path / "sys")
    tree.build_tree(root, [tree.SimBond("bond0", "mlx5_bond_0")], gid_slots=4, netns_mode="exclusive")
    with pytest.raises(NetnsModeError) as err:
        require_shared_netns(PluginConfig(sysfs_root=root))
    assert "= 'exclusive' is invalid" in str(err.value) and "rdma system set netns shared" in str(err.value)
    tree.set_netns_mode(root, "shared")
    assert require_shared_netns(PluginConfig(sysfs_root=root)) == "shared"


def test_unknown_netns_mode_is_not_fatal(tmp_path: Path) -> None:
    """No ib_core yet (the driver may load after the plugin): logged, the plugin starts."""
    (tmp_path / "sys").mkdir()
    assert require_shared_netns(PluginConfig(sysfs_root=str(tmp_path / "sys"))) is None
