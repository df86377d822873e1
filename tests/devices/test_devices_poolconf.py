"""The three ways to say which pools to serve, all through ``--config``: no pools (today's one
exclusive pool), ``mode: shared`` (TKE's shared mode), ``pools:``, and Mellanox's ``config.json``
unchanged; every bad value one sentence naming the key, the value and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import seed002

from rdma_cni.devices.config import DEFAULT_RESOURCE, ConfigError, load_config
from rdma_cni.devices.pools import EXCLUSIVE, SHARED, PoolSpec
from rdma_cni.devices.selectors import Selectors


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "sys").mkdir()
    (tmp_path / "dev").mkdir()
    return {
        "sysfs_root": str(tmp_path / "sys"),
        "dev_root": str(tmp_path / "dev"),
        "cni_conf": str(tmp_path / "absent.conf"),
    }


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_seed_copy_is_the_seeds_own_text() -> None:
    text = seed002.from_seed()
    if text is None:
        pytest.skip(f"{seed002.SEED} not here")
    assert text == seed002.COPY


def test_seed_002s_config_json_is_read_as_it_is(roots: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, "config.json", seed002.config_text())
    cfg = load_config(roots, path)
    assert cfg.pool_specs() == (
        PoolSpec("rdma/hca_shared_devices_a", SHARED, 200, Selectors(if_names=("ibs108",)), "configList[0]"),
    )


def test_a_mellanox_config_under_any_name_is_told_by_its_content(
    roots: dict[str, Any], tmp_path: Path
) -> None:
    doc = {
        "configList": [
            {"resourceName": "a", "rdmaHcaMax": 0, "devices": ["ib0"]},
            {"resourceName": "b", "resourcePrefix": "example.com", "rdmaHcaMax": 63},
        ]
    }
    cfg = load_config(roots, write(tmp_path, "rdma-devices", json.dumps(doc)))
    assert cfg.pool_specs() == (
        PoolSpec("rdma/a", SHARED, 0, Selectors(if_names=("ib0",)), "configList[0]"),  # devices = ifNames
        PoolSpec("example.com/b", SHARED, 63, Selectors(), "configList[1]"),  # no selectors: every HCA
    )


def test_no_pools_is_todays_one_exclusive_pool(roots: dict[str, Any], tmp_path: Path) -> None:
    assert load_config(roots, None).pool_specs() == (
        PoolSpec(DEFAULT_RESOURCE, EXCLUSIVE, 0, None, "resourceName"),
    )
    renamed = load_config({**roots, "resource_name": "example.com/rdma"}, None)
    assert [s.resource_name for s in renamed.pool_specs()] == ["example.com/rdma"]


def test_mode_shared_is_tkes_shared_pool_over_the_bonds(roots: dict[str, Any], tmp_path: Path) -> None:
    cfg = load_config(roots, write(tmp_path, "dp.yaml", "mode: shared\n"))
    assert cfg.pool_specs() == (PoolSpec(DEFAULT_RESOURCE, SHARED, 1000, None, "resourceName"),)
    cfg = load_config(
        {**roots, "resource_name": "example.com/shared"},
        write(tmp_path, "dp.yaml", "mode: shared\nsharedCount: 64\nlogLevel: debug\n"),
    )
    assert cfg.pool_specs() == (PoolSpec("example.com/shared", SHARED, 64, None, "resourceName"),)
    assert cfg.log_level == "debug"


def test_pools_each_with_its_resource_mode_count_and_selectors(roots: dict[str, Any], tmp_path: Path) -> None:
    text = """
pools:
  - resourceName: tke.cloud.tencent.com/tke-shared-rdma
  - resourceName: rdma/ib
    mode: shared
    count: 100
    selectors: {linkTypes: [InfiniBand], vendors: ["0x15B3"]}
  - {resourceName: rdma/roce, mode: shared, selectors: {rootDevices: ["17:00.0"]}}
kubeletRootDir: /data/kubelet
"""
    cfg = load_config(roots, write(tmp_path, "dp.yaml", text))
    assert cfg.pool_specs() == (
        PoolSpec(DEFAULT_RESOURCE, EXCLUSIVE, 0, None, "pools[0]"),
        PoolSpec(
            "rdma/ib", SHARED, 100, Selectors(vendors=("15b3",), link_types=("InfiniBand",)), "pools[1]"
        ),
        PoolSpec("rdma/roce", SHARED, 1000, Selectors(root_devices=("0000:17:00.0",)), "pools[2]"),
    )
    assert cfg.kubelet_root_dir == "/data/kubelet"


def mellanox(**entry: Any) -> str:
    return json.dumps({"configList": [{"resourceName": "a", "rdmaHcaMax": 10, **entry}]})


def mellanox_top(**top: Any) -> str:
    return json.dumps({"configList": [{"resourceName": "a", "rdmaHcaMax": 10}], **top})


BAD_MELLANOX = [
    (mellanox(rdmaHcaMax=-1), "configList[0].rdmaHcaMax", "whole number from 0"),
    (mellanox(rdmaHcaMax=1.5), "configList[0].rdmaHcaMax", "whole number"),
    (mellanox(rdmaHcaMax="200"), "configList[0].rdmaHcaMax", "whole number"),
    (mellanox(rdmaHcaMax=10**9), "configList[0].rdmaHcaMax", "100000"),
    (json.dumps({"configList": [{"resourceName": "a"}]}), "configList[0].rdmaHcaMax", "how many pods"),
    (mellanox(resourceName="hca-a"), "configList[0].resourceName", "letters, digits and _"),
    (json.dumps({"configList": [{"rdmaHcaMax": 1}]}), "configList[0].resourceName", "letters, digits"),
    (mellanox(resourcePrefix="Bad_Prefix"), "configList[0].resourcePrefix", "extended resource name"),
    (mellanox(resourcePrefix="kubernetes.io"), "configList[0].resourcePrefix", "outside kubernetes.io"),
    (mellanox(selectors={"pfNames": ["ens3f0"]}), "configList[0].selectors.pfNames", "does not implement"),
    (mellanox(selectors={"devices": ["1017"]}), "configList[0].selectors.devices", "vendors, deviceIDs"),
    (mellanox(selectors={"vendors": "15b3"}), "configList[0].selectors.vendors", "non-empty list"),
    (mellanox(selectors={"vendors": []}), "configList[0].selectors.vendors", "non-empty list"),
    (mellanox(selectors={"vendors": ["mellanox"]}), "configList[0].selectors.vendors", "hex"),
    (mellanox(selectors={"deviceIDs": [4123]}), "configList[0].selectors.deviceIDs", "hex"),
    (mellanox(selectors={"linkTypes": ["roce"]}), "configList[0].selectors.linkTypes", "ether"),
    (mellanox(selectors={"rootDevices": ["81:00"]}), "configList[0].selectors.rootDevices", "0000:81:00.0"),
    (mellanox(selectors={"ifNames": ["a b"]}), "configList[0].selectors.ifNames", "netdev names"),
    (mellanox(selectors=["ifNames"]), "configList[0].selectors", "mapping"),
    (mellanox(selectors={"ifNames": ["x"]}, devices=["y"]), "configList[0].devices", "not both"),
    (mellanox(devices="ib0"), "configList[0].devices", "non-empty list"),
    (mellanox(isRdma=True), "configList[0].isRdma", "does not implement"),
    (mellanox_top(periodicUpdateInterval=-5), "periodicUpdateInterval", ">= 0"),
    (mellanox_top(periodicUpdateInterval="60"), "periodicUpdateInterval", "whole number"),
    (mellanox_top(logLevel="debug"), "logLevel", "takes only configList, periodicUpdateInterval"),
    (json.dumps({"configList": []}), "configList", "non-empty list"),
    (json.dumps({"configList": {"resourceName": "a"}}), "configList", "non-empty list"),
    (json.dumps({"configList": ["a"]}), "configList[0]", "mapping"),
    (
        json.dumps(
            {"configList": [{"resourceName": "a", "rdmaHcaMax": 1}, {"resourceName": "a", "rdmaHcaMax": 2}]}
        ),
        "configList[1].resourceName",
        "same resource",
    ),
]


@pytest.mark.parametrize(("text", "key", "fix"), BAD_MELLANOX)
def test_every_bad_config_json_value_is_one_sentence(
    roots: dict[str, Any], tmp_path: Path, text: str, key: str, fix: str
) -> None:
    path = write(tmp_path, "config.json", text)
    with pytest.raises(ConfigError) as err:
        load_config(roots, path)
    msg = str(err.value)
    assert err.value.key == key and msg.startswith(f"{key} in {path} = ") and fix in msg, msg
    assert "\n" not in msg


BAD_POOLS = [
    ("pools: []", "pools", "non-empty list"),
    ("pools: {a: b}", "pools", "non-empty list"),
    ("pools: [x]", "pools[0]", "mapping"),
    ("pools: [{mode: shared}]", "pools[0].resourceName", "extended resource name"),
    ("pools: [{resourceName: rdma}]", "pools[0].resourceName", "domain/name"),
    ("pools: [{resourceName: kubernetes.io/rdma}]", "pools[0].resourceName", "outside kubernetes.io"),
    ("pools: [{resourceName: rdma/a, mode: hybrid}]", "pools[0].mode", "exclusive"),
    ("pools: [{resourceName: rdma/a, count: 5}]", "pools[0].count", "exclusive pool counts its bonds"),
    ("pools: [{resourceName: rdma/a, mode: shared, count: 0}]", "pools[0].count", "from 1"),
    ("pools: [{resourceName: rdma/a, mode: shared, count: -3}]", "pools[0].count", "from 1"),
    ("pools: [{resourceName: rdma/a, mode: shared, count: true}]", "pools[0].count", "whole number"),
    ("pools: [{resourceName: rdma/a, mode: shared, count: 1000001}]", "pools[0].count", "100000"),
    (
        "pools: [{resourceName: rdma/a, rdmaHcaMax: 5}]",
        "pools[0].rdmaHcaMax",
        "resourceName, mode, count, selectors",
    ),
    ("pools: [{resourceName: rdma/a, selectors: {ifname: [x]}}]", "pools[0].selectors.ifname", "ifNames"),
    (
        "pools: [{resourceName: rdma/a, selectors: {linkTypes: [eth0]}}]",
        "pools[0].selectors.linkTypes",
        "ether",
    ),
    (
        "pools: [{resourceName: rdma/a}, {resourceName: rdma/a, mode: shared}]",
        "pools[1].resourceName",
        "pools[0] has the same resource",
    ),
    (
        "pools: [{resourceName: rdma/a}]\nresourceName: rdma/b",
        "resourceName / --resource-name",
        "own resourceName",
    ),
    ("pools: [{resourceName: rdma/a}]\nmode: shared", "mode / --mode", "on a pool"),
    ("mode: hybrid", "mode", "exclusive"),
    ("mode: shared\nsharedCount: 0", "sharedCount", "from 1"),
    ("sharedCount: 10", "sharedCount", "add mode: shared"),
    ("configlist: []", "configlist", "did you mean configList"),
]


@pytest.mark.parametrize(("text", "key", "fix"), BAD_POOLS)
def test_every_bad_pools_value_is_one_sentence(
    roots: dict[str, Any], tmp_path: Path, text: str, key: str, fix: str
) -> None:
    path = write(tmp_path, "dp.yaml", text + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(roots, path)
    msg = str(err.value)
    assert err.value.key == key and msg.startswith(f"{key} in {path} = ") and fix in msg, msg
    assert "\n" not in msg


def test_resource_name_flag_cannot_rename_listed_pools(roots: dict[str, Any], tmp_path: Path) -> None:
    for text in (seed002.config_text(), "pools: [{resourceName: rdma/a}]\n"):
        with pytest.raises(ConfigError) as err:
            load_config({**roots, "resource_name": "example.com/x"}, write(tmp_path, "c", text))
        assert err.value.key == "resourceName / --resource-name" and "own resourceName" in str(err.value)


@pytest.mark.parametrize("plugin", ["rdma-macvlan", "rdma-ipvlan"])
def test_cni_conf_of_either_plugin_gives_masters_and_dirs(
    roots: dict[str, Any], tmp_path: Path, plugin: str
) -> None:
    conf = tmp_path / "delegate.conf"
    conf.write_text(
        json.dumps(
            {
                "cniVersion": "1.1.0",
                "name": f"tke-{plugin}",
                "type": plugin,
                "masters": ["bond0", "bond1"],
                "ipam": {"type": "host-local"},
            }
        )
    )
    cfg = load_config({**roots, "cni_conf": str(conf)}, None)
    assert cfg.masters == ("bond0", "bond1")
    assert cfg.data_dir == f"/var/lib/cni/{plugin}"  # each plugin's own default
    conf.write_text(
        json.dumps({"cniVersion": "1.1.0", "name": "x", "type": plugin, "dataDir": "/d", "runDir": "/r"})
    )
    cfg = load_config({**roots, "cni_conf": str(conf)}, None)
    assert (cfg.masters, cfg.data_dir, cfg.run_dir) == (None, "/d", "/r")


def test_cni_conf_of_another_plugin_is_refused(roots: dict[str, Any], tmp_path: Path) -> None:
    conf = tmp_path / "delegate.conf"
    conf.write_text(json.dumps({"cniVersion": "1.1.0", "name": "x", "type": "macvlan"}))
    with pytest.raises(ConfigError) as err:
        load_config({**roots, "cni_conf": str(conf)}, None)
    assert err.value.key == "type" and "tke-rdma-ipvlan" in str(err.value)
