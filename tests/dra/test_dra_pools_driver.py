"""The real ``rdma-dra-driver`` process given seed 002's Mellanox config.json with two more pools, on a
simulated node of 4 RoCE bonds and 2 InfiniBand HCAs (tests/poolnode.py: mlx5_4 on ibs108, NUMA 1;
mlx5_5 on ibs109, NUMA 0), talking to a loopback HTTPS API server in the node netns (tests/dra_api.py)
and to this test acting as kubelet over its unix sockets: every pool's devices on the slice with
their pool, shares and attributes, NodePrepareResources of two InfiniBand HCAs, an IPoIB netdev's
health on the slice, an HCA added at run time republished, and the start refused for pools that
overlap as the device plugin refuses them.

Timings are printed (run with -s), not asserted: the bounds are only how long a test waits."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import seed002
from dpnode import wait_for
from dra_api import DRIVER, DraApi
from kube_server import Pki
from netns import REPO, can_run
from poolnode import PoolNode, pool_node

from rdma_cni.proto import dra_v1_pb2, dra_v1_pb2_grpc
from rdma_cni.sim.devnodes import make_dev_nodes
from rdma_cni.sim.tree import SimIbHca, add_ib_hca

pytestmark = pytest.mark.netns

NODE = "node-a"
POOLS = {
    "rdma/hca_shared_devices_a": 200,  # seed 002's: ifNames [ibs108] -> mlx5_4
    "rdma/hca_shared_devices_b": 100,  # the RoCE HCAs: the bonds
    "rdma/ib_all": 10,  # every InfiniBand HCA: mlx5_4 a second time, and mlx5_5
}
CONFIG = json.loads(seed002.config_text())
CONFIG["configList"] += [
    {"resourceName": "hca_shared_devices_b", "rdmaHcaMax": 100,
     "selectors": {"vendors": ["15b3"], "linkTypes": ["ether"]}},
    {"resourceName": "ib_all", "rdmaHcaMax": 10, "selectors": {"linkTypes": ["infiniband"]}},
]
DEVICES = {
    "mlx5-4": "rdma/hca_shared_devices_a",
    **{f"bond{i}": "rdma/hca_shared_devices_b" for i in range(4)},
    "mlx5-4-ib-all": "rdma/ib_all",
    "mlx5-5": "rdma/ib_all",
}


@pytest.fixture(autouse=True)
def _root() -> None:
    reason = can_run()
    if reason:
        pytest.skip(reason)


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


@dataclass
class PoolDra:
    p: PoolNode
    api: DraApi
    kubeconfig: Path
    cdi: Path
    log: str

    @property
    def dra_socket(self) -> str:
        return os.path.join(self.p.d.kubelet.root, "plugins", DRIVER, "dra.sock")

    def argv(self, config: str) -> list[str]:
        d = self.p.d
        return ["ip", "netns", "exec", d.n.name, sys.executable, "-m", "rdma_cni.cli.dra_driver",
                "--config", self.p.write_config(config), "--kubelet-root-dir", d.kubelet.root,
                "--sysfs-root", d.sysfs, "--dev-root", d.dev, "--cni-conf", d.conf, "--node-name", NODE,
                "--kubeconfig", str(self.kubeconfig), "--cdi-dir", str(self.cdi), "--log-file", self.log,
                "--log-level", "debug", "--rescan-interval", "0.2"]

    def start(self, config: str) -> subprocess.Popen[bytes]:
        reg = os.path.join(self.p.d.kubelet.root, "plugins_registry", f"{DRIVER}-reg.sock")
        with open(self.log + ".stderr", "ab") as err:
            proc = subprocess.Popen(self.argv(config), stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
                                    env=dict(os.environ, PYTHONPATH=REPO))
        self.p.d.procs.append(proc)
        wait_for(lambda: _answers(reg) or proc.poll() is not None, 30, "registration socket")
        assert proc.poll() is None, self.log_tail()
        return proc

    def log_tail(self) -> str:
        return "".join(Path(p).read_text(errors="replace") for p in (self.log, self.log + ".stderr")
                       if os.path.exists(p))[-3000:]

    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in list(self.api.slices.values()) for d in s["spec"].get("devices", [])}

    def tainted(self) -> list[str]:
        return sorted(n for n, d in self.devices().items() if "taints" in d)


@pytest.fixture
def dra() -> Iterator[PoolDra]:
    with pool_node() as p:
        tmp = Path(p.d.n.tmp)
        api = DraApi(Pki(tmp / "pki"), netns=p.d.n.name, node=NODE)
        with api:
            yield PoolDra(p, api, api.kubeconfig(tmp / "kubeconfig"), tmp / "cdi", str(tmp / "dra.log"))


def test_mellanox_config_json_pools_are_published_prepared_watched_and_follow_the_node(dra: PoolDra) -> None:
    t0 = time.monotonic()
    dra.start(json.dumps(CONFIG, indent=4))
    try:
        wait_for(lambda: set(dra.devices()) == set(DEVICES), 30, "every pool's devices on the slice")
    except AssertionError as e:
        raise AssertionError(f"{e}: {sorted(dra.devices())}; log: {dra.log_tail()}") from None
    print(f"\nstart -> slice of {len(DEVICES)} pool devices: {(time.monotonic() - t0) * 1000:.0f} ms")
    devs = dra.devices()
    assert list(devs) == list(DEVICES)  # pool by pool in the config's order
    for name, pool in DEVICES.items():
        assert devs[name]["attributes"]["pool"] == {"string": pool}
        assert devs[name]["allowMultipleAllocations"] is True
        assert devs[name]["capacity"]["shares"]["value"] == str(POOLS[pool])
    ib = devs["mlx5-4"]["attributes"]
    assert ib == {"hca": {"string": "mlx5_4"}, "resource.kubernetes.io/pcieRoot": {"string": "pci0000:40"},
                  "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
                  "resource.kubernetes.io/numaNode": {"int": 1}, "linkLayer": {"string": "InfiniBand"},
                  "pool": {"string": "rdma/hca_shared_devices_a"},
                  # what upstream Multus's DRA path matches a NAD by, and hands its delegate
                  "k8s.cni.cncf.io/resourceName": {"string": "rdma/hca_shared_devices_a"},
                  "k8s.cni.cncf.io/deviceID": {"string": "mlx5_4"}}
    ib_all = {"pool": {"string": "rdma/ib_all"}, "k8s.cni.cncf.io/resourceName": {"string": "rdma/ib_all"}}
    assert devs["mlx5-4-ib-all"]["attributes"] == {**ib, **ib_all}
    bond2 = devs["bond2"]["attributes"]
    assert bond2["bond"] == {"string": "bond2"} and bond2["hca"] == {"string": "mlx5_bond_2"}
    assert bond2["ipv4Subnet"] == {"string": "198.51.100.32/28"} and isinstance(bond2["gidIndex"]["int"], int)
    assert bond2["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:20"}
    assert dra.tainted() == []

    # NodePrepareResources of a claim of both InfiniBand HCAs
    claim = dra.api.add_claim("default", "ib", [("ib", "mlx5-4"), ("ib", "mlx5-5")], node=NODE)
    uid = claim["metadata"]["uid"]
    with grpc.insecure_channel(f"unix:{dra.dra_socket}") as ch:
        t = time.perf_counter()
        resp = dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(namespace="default", uid=uid,
                                                                            name="ib")]), timeout=20)
        print(f"NodePrepareResources of 2 InfiniBand HCAs: {(time.perf_counter() - t) * 1000:.1f} ms")
    entry = resp.claims[uid]
    assert entry.error == "" and [d.device_name for d in entry.devices] == ["mlx5-4", "mlx5-5"]
    doc = json.loads((dra.cdi / f"rdma.tke.cloud.tencent.com-bond_{uid}.json").read_text())
    assert [[n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in doc["devices"]] == [
        [f"/dev/infiniband/{k}{n}" for k in ("uverbs", "umad", "issm")] for n in (4, 5)]
    env = dict(e.split("=", 1) for e in doc["containerEdits"]["env"])
    assert env == {"NCCL_IB_HCA": "=mlx5_4,mlx5_5", "UCX_NET_DEVICES": "mlx5_4:1,mlx5_5:1"}

    # health: the IPoIB netdev of mlx5_4 down taints it in both its pools, up clears it
    for state, want in (("down", ["mlx5-4", "mlx5-4-ib-all"]), ("up", [])):
        t1 = time.monotonic()
        dra.p.d.n.ip("link", "set", "ibs108", state)
        wait_for(lambda w=want: dra.tainted() == w, 10, f"ibs108 {state} on the slice")  # type: ignore[misc]
        print(f"ibs108 {state} -> slice: {(time.monotonic() - t1) * 1000:.0f} ms")

    # an InfiniBand HCA that appears joins the pool that selects it, and the slice is written again
    [generation] = [s["spec"]["pool"]["generation"] for s in dra.api.slices.values()]
    t2 = time.monotonic()
    add_ib_hca(dra.p.d.sysfs, SimIbHca("mlx5_6", "ibs110", pci_index=6, uverbs=6, numa_node=0))
    make_dev_nodes(dra.p.d.sysfs, dra.p.d.dev)
    dra.p.d.n.bond("ibs110", "203.0.113.34/28")
    # (its IPoIB netdev comes a moment after sysfs shows it: until then it is tainted, as it should be)
    wait_for(lambda: "mlx5-6" in dra.devices() and dra.tainted() == [], 10, "mlx5-6 healthy on the slice")
    print(f"new HCA -> slice: {(time.monotonic() - t2) * 1000:.0f} ms")
    assert dra.devices()["mlx5-6"]["attributes"]["pool"] == {"string": "rdma/ib_all"}
    assert [s["spec"]["pool"]["generation"] for s in dra.api.slices.values()] > [generation]


def test_an_hca_in_an_exclusive_and_another_pool_stops_the_start_with_exit_2_naming_both(
    dra: PoolDra,
) -> None:
    text = """
pools:
  - resourceName: tke.cloud.tencent.com/tke-shared-rdma
  - {resourceName: rdma/roce, mode: shared, count: 10, selectors: {linkTypes: [ether]}}
"""
    p = subprocess.run(dra.argv(text), capture_output=True, text=True, cwd=REPO, timeout=60,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert p.returncode == 2, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("rdma-dra-driver: pools[1].selectors") and "Traceback" not in p.stderr
    assert ("mlx5_bond_0 is in exclusive pool tke.cloud.tencent.com/tke-shared-rdma and in pool rdma/roce"
            in line)
    assert dra.api.slices == {}
