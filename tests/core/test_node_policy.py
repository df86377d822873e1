"""The node policy (rdma_cni/node_policy.py) as a pure function: the file read strictly (each bad key
named with the file), every host and kubelet path of every plugin filled from the node and refused
when a config names another, the knobs only a node turns, ``masters`` only within the node's bonds,
NAD namespaces and delegate types, and the configs this repository ships passing unchanged under the
defaults (the policy a node without a policy file has).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rdma_cni import node_policy
from rdma_cni.cni.errors import INVALID_CONFIG, CniError, ConfigKeyError
from rdma_cni.node_policy import DEFAULT_PATHS, NodePolicy, load, parse

pytestmark = pytest.mark.tenant

REPO = Path(__file__).resolve().parents[2]
SHIPPED = {
    "rdma-macvlan": REPO / "conf/vpc-cni/rdma-multus.d/tke-rdma-macvlan.conf",
    "rdma-ipvlan": REPO / "conf/shared-mode/rdma-multus.d/tke-rdma-ipvlan.conf",
}
STRICT = NodePolicy()


def shipped(plugin: str) -> dict[str, Any]:
    data = json.loads(SHIPPED[plugin].read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("plugin", sorted(SHIPPED))
def test_the_shipped_delegate_configs_pass_the_default_policy_unchanged(plugin: str) -> None:
    raw = shipped(plugin)
    node = {k: v for k, v in DEFAULT_PATHS[plugin].items() if v is not None}
    assert STRICT.narrow(raw, plugin) == {**node, **raw}


@pytest.mark.parametrize("mode", ["vpc-cni", "global-router"])
def test_the_shipped_meta_config_passes_the_default_policy(mode: str) -> None:
    (plugin,) = json.loads((REPO / f"conf/{mode}/00-rdma-multus.conflist").read_text())["plugins"]
    assert STRICT.narrow(plugin, "rdma-multus")["confDir"] == "/etc/cni/net.d/rdma-multus.d"


@pytest.mark.parametrize("plugin", sorted(DEFAULT_PATHS))
def test_every_node_key_of_every_plugin_is_refused_when_a_config_names_another_value(plugin: str) -> None:
    for key, node_value in DEFAULT_PATHS[plugin].items():
        other: Any = ["/tmp/tenant"] if key == "binDirs" else "l3" if key == "ipvlanMode" else (
            "macvlan" if key == "link" else "/tmp/tenant")
        with pytest.raises(ConfigKeyError) as err:
            STRICT.narrow({"type": plugin, key: other}, plugin)
        assert err.value.code == INVALID_CONFIG and err.value.key == key
        assert f"config key {key!r}" in err.value.msg and node_policy.DEFAULT_PATH in err.value.msg
        assert "the node's admin" in err.value.msg
        # DEL/GC: never refused, and only ever the node's value
        cleaned = STRICT.narrow({"type": plugin, key: other}, plugin, cleanup=True)
        assert cleaned.get(key) == node_value


def test_log_file_may_be_narrowed_to_stderr_only() -> None:
    assert STRICT.narrow({"logFile": ""}, "rdma-macvlan")["logFile"] == ""


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"rdma": {"required": False}}, "rdma.required"),
        ({"rdma": {"netnsMode": "exclusive"}}, "rdma.netnsMode"),
        ({"ipam": {"type": "host-local", "dataDir": "/tmp/x"}}, "ipam"),
        ({"ipam": {"type": "static", "addresses": [{"address": "203.0.113.11/24"}]}}, "ipam"),
    ],
)
def test_a_knob_only_the_node_turns_is_refused(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigKeyError) as err:
        STRICT.narrow(raw, "rdma-macvlan")
    assert err.value.key == key and "does not allow" in err.value.msg


def test_the_node_may_allow_those_knobs_and_a_config_may_still_narrow() -> None:
    policy = parse({"rdmaRequired": False, "ipamTypes": ["host-local"], "netnsMode": "exclusive"}, "/p")
    raw = {"rdma": {"required": False, "netnsMode": "exclusive"}, "ipam": {"type": "host-local"}}
    assert policy.narrow(raw, "rdma-macvlan")["ipam"] == {"type": "host-local"}
    assert policy.narrow({"rdma": {"required": True}}, "rdma-macvlan")["rdma"] == {"required": True}


def test_del_drops_an_ipam_the_node_would_not_have_run() -> None:
    raw = {"ipam": {"type": "host-local", "dataDir": "/tmp/x"}}
    cleaned = STRICT.narrow(raw, "rdma-macvlan", cleanup=True)
    assert "ipam" not in cleaned


def test_masters_may_only_name_the_nodes_bonds() -> None:
    STRICT.check_masters(["bond1"], ["bond0", "bond1"])
    STRICT.check_masters(None, ["bond0"])
    with pytest.raises(ConfigKeyError) as err:
        STRICT.check_masters(["bond1", "eth0"], ["bond0", "bond1"])
    assert err.value.key == "masters" and "eth0" in err.value.msg and "bond0, bond1" in err.value.msg
    assert parse({"bonds": ["bond3"]}).node_bonds(["bond0"]) == ["bond3"]


def test_resource_name_must_be_one_the_node_opens_bonds_for() -> None:
    STRICT.check_resource("tke.cloud.tencent.com/tke-shared-rdma")
    with pytest.raises(ConfigKeyError) as err:
        STRICT.check_resource("example.com/none")
    assert err.value.key == "resourceName"


def test_trust_configs_lets_configs_decide_as_before() -> None:
    policy = parse({"trust": "configs"})
    raw = {"dataDir": "/tmp/x", "rdma": {"required": False}, "masters": ["eth0"]}
    assert policy.narrow(raw, "rdma-macvlan") == raw
    policy.check_masters(["eth0"], ["bond0"])
    policy.check_resource("example.com/none")


def test_nad_namespaces_and_types() -> None:
    nets = STRICT.networks
    assert nets.namespace_allowed("team-a", "team-a") and nets.namespace_allowed("team-a", "default")
    assert not nets.namespace_allowed("team-a", "team-b")
    assert not nets.type_allowed("host-device") and not nets.type_allowed("rdma-multus")
    assert nets.type_allowed("rdma-macvlan") and nets.type_allowed("macvlan")
    only = parse({"networks": {"allowedTypes": ["rdma-macvlan"], "namespaceIsolation": False}}).networks
    assert only.type_allowed("rdma-macvlan") and not only.type_allowed("macvlan")
    assert only.namespace_allowed("team-a", "team-b")


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ([], ""),
        ({"trust": "tenants"}, "trust"),
        ({"bonds": "bond0"}, "bonds"),
        ({"bonds": ["../x"]}, "bonds"),
        ({"paths": {"rdma-macvlan": {"dataDir": "relative"}}}, "paths.rdma-macvlan.dataDir"),
        ({"paths": {"rdma-macvlan": {"nope": "/x"}}}, "paths.rdma-macvlan.nope"),
        ({"paths": {"other": {}}}, "paths.other"),
        ({"paths": {"rdma-ipvlan": {"link": "vxlan"}}}, "paths.rdma-ipvlan.link"),
        ({"rdmaRequired": "no"}, "rdmaRequired"),
        ({"networks": {"namespaceIsolation": 1}}, "networks.namespaceIsolation"),
        ({"networks": {"globalNamespaces": "default"}}, "networks.globalNamespaces"),
        ({"ipamTypes": [""]}, "ipamTypes"),
    ],
)
def test_a_bad_policy_file_is_error_7_naming_the_file_and_the_key(data: Any, key: str) -> None:
    with pytest.raises(CniError) as err:
        parse(data, "/etc/rdma-cni/node-policy.json")
    assert err.value.code == INVALID_CONFIG and "/etc/rdma-cni/node-policy.json" in err.value.msg
    assert (f"key {key!r}" in err.value.msg) if key else "JSON object" in err.value.msg


def test_load_reads_the_file_the_environment_names_and_defaults_without_one(tmp_path: Path) -> None:
    f = tmp_path / "policy.json"
    assert load({node_policy.POLICY_ENV: str(f)}) == NodePolicy(path=str(f))
    f.write_text('{"bonds": ["bond0"]}')
    got = load({node_policy.POLICY_ENV: str(f)})
    assert got.found and got.bonds == ("bond0",) and got.enforced
    f.write_text("{broken")
    with pytest.raises(CniError) as err:
        load({node_policy.POLICY_ENV: str(f)})
    assert "not valid JSON" in err.value.msg and str(f) in err.value.msg
