"""The real ``rdma-dra-driver`` process on a simulated 8-bond node (tests/dpnode.py: veth bonds in a
node netns, the simulated sysfs with PCIe roots and NUMA nodes, char devices under a dev root), talking
to a loopback HTTPS API server inside that netns (tests/dra_api.py) and to this test acting as kubelet
over its unix sockets: the published slices, a bond's taint following its health, and a kill -9 in
the middle of NodePrepareResources followed by kubelet's retry.

Timings are printed (run with -s), not asserted: the bounds are only how long a test waits."""

from __future__ import annotations

import json
import os
import signal
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
from dpnode import DpNode, dp_node, wait_for
from dra_api import DRIVER, DraApi
from kube_server import Pki
from netns import REPO, can_run

from rdma_cni.proto import dra_v1_pb2, dra_v1_pb2_grpc
from rdma_cni.proto import pluginregistration_v1_pb2 as reg_pb
from rdma_cni.proto import pluginregistration_v1_pb2_grpc as reg_grpc
from rdma_cni.sim.tree import set_port_state

pytestmark = pytest.mark.netns

NODE = "node-a"


@pytest.fixture(autouse=True)
def _root() -> None:
    reason = can_run()
    if reason:
        pytest.skip(reason)


@dataclass
class DraNode:
    d: DpNode
    api: DraApi
    kubeconfig: Path
    cdi: Path
    log: str

    @property
    def root(self) -> str:
        return self.d.kubelet.root

    @property
    def dra_socket(self) -> str:
        return os.path.join(self.root, "plugins", DRIVER, "dra.sock")

    @property
    def reg_socket(self) -> str:
        return os.path.join(self.root, "plugins_registry", f"{DRIVER}-reg.sock")

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        argv = ["ip", "netns", "exec", self.d.n.name, sys.executable, "-m", "rdma_cni.cli.dra_driver",
                "--kubelet-root-dir", self.root, "--sysfs-root", self.d.sysfs, "--dev-root", self.d.dev,
                "--cni-conf", self.d.conf, "--node-name", NODE, "--kubeconfig", str(self.kubeconfig),
                "--cdi-dir", str(self.cdi), "--log-file", self.log, "--log-level", "debug",
                "--rescan-interval", "0.2"]
        with open(self.log + ".stderr", "ab") as err:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
                                    env=dict(os.environ, PYTHONPATH=REPO, **(env or {})))
        self.d.procs.append(proc)
        # A killed driver's socket file stays: wait until one answers.
        wait_for(lambda: _answers(self.reg_socket) or proc.poll() is not None, 30, "registration socket")
        assert proc.poll() is None, self.log_tail()
        return proc

    def log_tail(self) -> str:
        text = ""
        for path in (self.log, self.log + ".stderr"):
            if os.path.exists(path):
                text += Path(path).read_text(errors="replace")
        return text[-3000:]

    def slice_devices(self) -> list[dict[str, Any]]:
        return [d for s in list(self.api.slices.values()) for d in s["spec"].get("devices", [])]

    def prepare(self, uid: str, name: str, timeout: float = 20) -> dra_v1_pb2.NodePrepareResourceResponse:
        with grpc.insecure_channel(f"unix:{self.dra_socket}") as ch:
            resp = dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="default", uid=uid, name=name)]), timeout=timeout)
        return resp.claims[uid]

    def specs(self) -> list[str]:
        return sorted(os.listdir(self.cdi)) if self.cdi.exists() else []

    def records(self) -> dict[str, dict[str, Any]]:
        d = os.path.join(self.root, "plugins", DRIVER, "claims")
        return {n: json.loads(Path(d, n).read_text()) for n in sorted(os.listdir(d)) if n.endswith(".json")}


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


@pytest.fixture
def dra() -> Iterator[DraNode]:
    with dp_node(bonds=8, numa=lambda i: i // 4, kubelet=False) as d:
        tmp = Path(d.n.tmp)
        with DraApi(Pki(tmp / "pki"), netns=d.n.name, node=NODE) as api:
            yield DraNode(d, api, api.kubeconfig(tmp / "kubeconfig"), tmp / "cdi", str(tmp / "dra.log"))


def test_publishes_every_bond_with_pcie_root_numa_and_gid_index_and_registers(dra: DraNode) -> None:
    t0 = time.monotonic()
    dra.start()
    wait_for(lambda: len(dra.slice_devices()) == 8, 30, "a slice with 8 devices")
    print(f"\nstart -> slice published: {(time.monotonic() - t0) * 1000:.0f} ms")
    devs = {d["name"]: d for d in dra.slice_devices()}
    assert sorted(devs) == [f"bond{i}" for i in range(8)]
    for i in range(8):
        attrs = devs[f"bond{i}"]["attributes"]
        assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": f"pci0000:{0x20 * (i // 2):02x}"}
        assert attrs["resource.kubernetes.io/pciBusID"] == {"string": f"0000:{0x17 + i:02x}:00.0"}
        assert attrs["resource.kubernetes.io/numaNode"] == {"int": i // 4}
        assert attrs["hca"] == {"string": f"mlx5_bond_{i}"} and attrs["bond"] == {"string": f"bond{i}"}
        assert attrs["linkLayer"] == {"string": "Ethernet"}
        assert attrs["ipv4Subnet"] == {"string": f"198.51.100.{16 * i}/28"}
        assert isinstance(attrs["gidIndex"]["int"], int)
        assert "taints" not in devs[f"bond{i}"]
    [obj] = dra.api.slices.values()
    assert obj["metadata"]["ownerReferences"][0]["uid"] == dra.api.node_uid
    with grpc.insecure_channel(f"unix:{dra.reg_socket}") as ch:
        info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=5)
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, dra.dra_socket)


def test_bond_down_taints_its_device_and_up_clears_it(dra: DraNode) -> None:
    dra.start()
    wait_for(lambda: len(dra.slice_devices()) == 8, 30, "a slice with 8 devices")

    def tainted() -> bool:
        return any("taints" in d for d in dra.slice_devices() if d["name"] == "bond3")

    for what, change, want in (("down", "down", True), ("up", "up", False)):
        t0 = time.monotonic()
        dra.d.n.ip("link", "set", "bond3", change)
        took = wait_for(lambda w=want: tainted() is w, 10, f"bond3 {what} reaching the slice")  # type: ignore[misc]
        print(f"\nbond3 {what} -> slice: {took * 1000:.0f} ms ({(time.monotonic() - t0) * 1000:.0f} ms)")
    assert sum("taints" in d for d in dra.slice_devices()) == 0


@pytest.mark.parametrize("step", ["dra-prepare-write-ahead", "dra-prepare-spec-written"])
def test_kill9_mid_prepare_then_retry_ends_in_one_prepared_state(dra: DraNode, step: str) -> None:
    claim = dra.api.add_claim("default", "nics", [("nic", f"bond{i}") for i in range(4)], node=NODE)
    uid = claim["metadata"]["uid"]
    proc = dra.start(env={"RDMA_CNI_FAILPOINT": step})
    with pytest.raises(grpc.RpcError):
        dra.prepare(uid, "nics")
    assert proc.wait(10) == -signal.SIGKILL
    assert [r["phase"] for r in dra.records().values()] == ["preparing"]
    # kubelet retries against the restarted driver (the sockets of the dead one are still there)
    dra.start()
    entry = dra.prepare(uid, "nics")
    assert entry.error == "" and len(entry.devices) == 4
    assert dra.specs() == [f"rdma.tke.cloud.tencent.com-bond_{uid}.json"]
    records = dra.records()
    assert list(records) == [f"{uid}.json"] and records[f"{uid}.json"]["phase"] == "prepared"
    doc = json.loads((dra.cdi / dra.specs()[0]).read_text())
    env = dict(e.split("=", 1) for e in doc["containerEdits"]["env"])
    assert env["NCCL_IB_HCA"] == "=mlx5_bond_0,mlx5_bond_1,mlx5_bond_2,mlx5_bond_3"
    assert env["NCCL_IB_GID_INDEX"].isdigit()
    assert [n["path"] for n in doc["devices"][0]["containerEdits"]["deviceNodes"]] == [
        "/dev/infiniband/uverbs0", "/dev/infiniband/umad0", "/dev/infiniband/issm0"]
    assert dra.prepare(uid, "nics") == entry  # and once more: the same answer


def test_port_state_without_event_reaches_the_slice_through_the_rescan(dra: DraNode) -> None:
    dra.start()
    wait_for(lambda: len(dra.slice_devices()) == 8, 30, "a slice with 8 devices")

    def tainted() -> bool:
        return any("taints" in d for d in dra.slice_devices() if d["name"] == "bond5")

    for active in (False, True):
        t0 = time.monotonic()
        set_port_state(dra.d.sysfs, "mlx5_bond_5", 1, active=active)
        wait_for(lambda a=active: tainted() is not a, 10, f"port ACTIVE={active} on the slice")  # type: ignore[misc]
        took = (time.monotonic() - t0) * 1000
        print(f"\nRDMA port {'ACTIVE' if active else 'DOWN'} -> slice: {took:.0f} ms")


def test_restart_updates_the_same_slice_and_sigterm_removes_the_sockets(dra: DraNode) -> None:
    proc = dra.start()
    wait_for(lambda: len(dra.slice_devices()) == 8, 30, "a slice with 8 devices")
    assert dra.d.stop(proc) == 0
    assert not os.path.exists(dra.reg_socket) and not os.path.exists(dra.dra_socket)
    writes, seen = len(dra.api.slice_writes), len(dra.api.requests)
    dra.start()

    def listed() -> bool:
        return any(r["path"].startswith("/apis/resource.k8s.io/v1/resourceslices?")
                   for r in dra.api.requests[seen:])

    wait_for(listed, 30, "the restarted driver's look at its slices")
    time.sleep(1.0)
    assert len(dra.api.slices) == 1 and len(dra.api.slice_writes) == writes  # same content: nothing written


def test_registration_socket_removed_is_served_again(dra: DraNode) -> None:
    dra.start()
    os.unlink(dra.reg_socket)
    try:
        took = wait_for(lambda: _answers(dra.reg_socket), 10, "the registration socket back")
    except AssertionError as e:
        raise AssertionError(f"{e}; driver log: {dra.log_tail()}") from None
    print(f"\nregistration socket removed -> served again: {took * 1000:.0f} ms")
    with grpc.insecure_channel(f"unix:{dra.reg_socket}") as ch:
        info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=5)
    assert info.name == DRIVER


def test_rdma_device_gone_from_sysfs_stays_listed_tainted_until_it_is_back(dra: DraNode) -> None:
    dra.start()
    wait_for(lambda: len(dra.slice_devices()) == 8, 30, "a slice with 8 devices")
    link = os.path.join(dra.d.sysfs, "class", "infiniband", "mlx5_bond_6")
    aside = os.path.join(dra.d.sysfs, "class", "infiniband", ".mlx5_bond_6-gone")

    def state() -> tuple[int, bool]:
        devs = dra.slice_devices()
        return len(devs), any("taints" in d for d in devs if d["name"] == "bond6")

    os.rename(link, aside)  # the driver unloaded, or the bond's LAG broke up
    wait_for(lambda: state() == (8, True), 10, "bond6 kept and tainted")
    os.rename(aside, link)
    wait_for(lambda: state() == (8, False), 10, "bond6 back and untainted")


def test_an_idle_driver_only_watches_and_a_slice_kubelet_deletes_comes_back(dra: DraNode) -> None:
    dra.start()
    wait_for(lambda: len(dra.slice_devices()) == 8 and dra.api.open_watches == 1, 30, "the slice and a watch")
    calls = len(dra.api.driver_calls())
    time.sleep(2.0)  # ten rescans at --rescan-interval 0.2
    assert len(dra.api.driver_calls()) == calls, dra.api.driver_calls()[calls:]
    dra.api.delete_node_slices()  # kubelet's wipeResourceSlices, at its start or after we were away
    took = wait_for(lambda: len(dra.slice_devices()) == 8, 10, "the slice back after kubelet's wipe")
    print(f"\nslice deleted by kubelet -> published again: {took * 1000:.0f} ms")
    assert [(r["method"], r["path"]) for r in dra.api.driver_calls()[calls:]] == [
        ("POST", "/apis/resource.k8s.io/v1/resourceslices")]
