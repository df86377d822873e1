"""The DRA driver's kubelet side over real gRPC on unix sockets in a tmp dir, and its API side against
a loopback HTTPS API server (tests/dra_api.py): registration as kubelet's plugin watcher sees it,
NodePrepareResources / NodeUnprepareResources in v1 and v1beta1, idempotency, refusals, and the
ResourceSlice publisher. The driver runs in this process on a snapshot of four bonds; the device
model's Allocate answer (device nodes, env) comes from the real code under a tmp dev root."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from dra_api import DRIVER, DraApi
from kube_server import Pki

from rdma_cni.deviceplugin.server import Board
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.facts import BondFacts
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot
from rdma_cni.devices.pools import SHARED
from rdma_cni.dra.driver import Driver
from rdma_cni.dra.kubeapi import ResourceClient
from rdma_cni.dra.prepared import PREPARED
from rdma_cni.dra.publish import SlicePublisher
from rdma_cni.dra.service import Registration, serve_dra, serve_registration
from rdma_cni.dra.slices import slice_specs
from rdma_cni.kube import kubeconfig
from rdma_cni.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    drahealth_v1_pb2,
    drahealth_v1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
)
from rdma_cni.proto import pluginregistration_v1_pb2 as reg_pb
from rdma_cni.proto import pluginregistration_v1_pb2_grpc as reg_grpc

NODE = "node-a"
KIND = "rdma.tke.cloud.tencent.com/bond"


def bonds(n: int = 4) -> tuple[RdmaBond, ...]:
    return tuple(RdmaBond(f"mlx5_bond_{i}", f"bond{i}", 1, i // 2, f"uverbs{i}", (f"umad{i}",), (f"issm{i}",),
                          f"0000:{0x17 + i:02x}:00.0", f"pci0000:{(i // 2) * 0x20:02x}") for i in range(n))


def snapshot(unhealthy: str = "") -> Snapshot:
    bs = bonds()
    return Snapshot(bs, tuple(
        DeviceHealth(b.id, b.id != unhealthy, "bond is down" if b.id == unhealthy else "") for b in bs))


@dataclass
class Rig:
    tmp: Path
    api: DraApi
    driver: Driver
    board: Board
    cdi: Path
    channel: grpc.Channel

    @property
    def v1(self) -> dra_v1_pb2_grpc.DRAPluginStub:
        return dra_v1_pb2_grpc.DRAPluginStub(self.channel)

    def prepare(self, *claims: tuple[str, str, str]) -> dra_v1_pb2.NodePrepareResourcesResponse:
        req = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        return self.v1.NodePrepareResources(req, timeout=10)

    def unprepare(self, *claims: tuple[str, str, str]) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        req = dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        return self.v1.NodeUnprepareResources(req, timeout=10)

    def specs(self) -> list[str]:
        return sorted(os.listdir(self.cdi)) if self.cdi.exists() else []


def config(tmp: Path, mode: str = "exclusive") -> PluginConfig:
    dev = tmp / "dev" / "infiniband"
    dev.mkdir(parents=True)
    for name in ["rdma_cm", *(f"{k}{i}" for k in ("uverbs", "umad") for i in range(4))]:
        (dev / name).write_text("")  # Allocate checks that umad/issm/rdma_cm exist, nothing more
    gid = tmp / "run" / "gid"
    gid.mkdir(parents=True)
    # The host GID index rdma-macvlan recorded: what Allocate falls back to when no bond address is
    # in this netns (the bonds here are not real links).
    (gid / "host.json").write_text(json.dumps({"ports": [{"netdev": f"bond{i}", "gidIndex": 3}
                                                        for i in range(4)]}))
    return PluginConfig(sysfs_root=str(tmp), dev_root=str(tmp / "dev"), run_dir=str(tmp / "run"),
                        data_dir=str(tmp / "data"), mode=mode)


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    mode = getattr(request, "param", "exclusive")
    with DraApi(Pki(tmp_path / "pki"), node=NODE) as api:
        client = ResourceClient(kubeconfig.load(str(api.kubeconfig(tmp_path / "kc"))), timeout=5)
        board = Board(snapshot())
        driver = Driver(config(tmp_path, mode), NODE, board, client, str(tmp_path / "claims"),
                        str(tmp_path / "cdi"))
        sock = str(tmp_path / "dra.sock")
        server = serve_dra(driver, sock, board)
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            yield Rig(tmp_path, api, driver, board, tmp_path / "cdi", ch)
        server.stop(grace=0).wait(2)


def test_registration_answers_the_plugin_watcher_with_both_dra_services() -> None:
    # A short dir of its own: the socket's name is long, and a unix socket path has 107 bytes at most.
    short = tempfile.mkdtemp(prefix="dra-")
    reg_sock = os.path.join(short, f"{DRIVER}-reg.sock")
    registration = Registration("/var/lib/kubelet/plugins/rdma.tke.cloud.tencent.com/dra.sock",
                                with_health=True)
    server = serve_registration(registration, reg_sock)
    try:
        with grpc.insecure_channel(f"unix:{reg_sock}") as ch:
            stub = reg_grpc.RegistrationStub(ch)
            info = stub.GetInfo(reg_pb.InfoRequest(), timeout=5)
            assert (info.type, info.name) == ("DRAPlugin", DRIVER)
            assert info.endpoint == "/var/lib/kubelet/plugins/rdma.tke.cloud.tencent.com/dra.sock"
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin",
                                                     "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
            stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True), timeout=5)
            assert registration.registered.is_set()
            stub.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=False, error="version mismatch"), timeout=5)
            assert not registration.registered.is_set() and registration.last_error == "version mismatch"
    finally:
        server.stop(grace=0).wait(2)
        shutil.rmtree(short, ignore_errors=True)


def test_prepare_writes_one_cdi_spec_with_the_device_plugins_env_and_answers_its_ids(rig: Rig) -> None:
    claim = rig.api.add_claim("default", "nics", [("nic", "bond0"), ("nic", "bond1"), ("nic", "bond2"),
                                                  ("nic", "bond3")])
    uid = claim["metadata"]["uid"]
    resp = rig.prepare(("default", uid, "nics"))
    entry = resp.claims[uid]
    assert entry.error == ""
    assert [(d.pool_name, d.device_name, list(d.request_names)) for d in entry.devices] == [
        (NODE, f"bond{i}", ["nic"]) for i in range(4)]
    assert [list(d.cdi_device_ids) for d in entry.devices] == [
        [f"{KIND}={uid}-mlx5_bond_{i}"] for i in range(4)]
    assert rig.specs() == [f"rdma.tke.cloud.tencent.com-bond_{uid}.json"]
    doc = json.loads((rig.cdi / rig.specs()[0]).read_text())
    env = dict(e.split("=", 1) for e in doc["containerEdits"]["env"])
    assert env == {"NCCL_IB_HCA": "=mlx5_bond_0,mlx5_bond_1,mlx5_bond_2,mlx5_bond_3",
                   "UCX_NET_DEVICES": "mlx5_bond_0:1,mlx5_bond_1:1,mlx5_bond_2:1,mlx5_bond_3:1",
                   "NCCL_IB_GID_INDEX": "3", "UCX_IB_GID_INDEX": "3"}
    assert [n["path"] for n in doc["containerEdits"]["deviceNodes"]] == ["/dev/infiniband/rdma_cm"]
    assert [n["path"] for n in doc["devices"][0]["containerEdits"]["deviceNodes"]] == [
        "/dev/infiniband/uverbs0", "/dev/infiniband/umad0"]  # issm0 is not on this host
    rec = rig.driver.records.get(uid)
    assert rec is not None and rec.phase == PREPARED and len(rec.devices) == 4


def test_prepare_again_answers_the_same_without_asking_the_api_server(rig: Rig) -> None:
    uid = rig.api.add_claim("default", "nics", [("nic", "bond1")])["metadata"]["uid"]
    first = rig.prepare(("default", uid, "nics"))
    gets = rig.api.get_count("resourceclaims")
    again = rig.prepare(("default", uid, "nics"))
    assert again == first and rig.api.get_count("resourceclaims") == gets
    beta = dra_v1beta1_pb2_grpc.DRAPluginStub(rig.channel).NodePrepareResources(
        dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[dra_v1beta1_pb2.Claim(
            namespace="default", uid=uid, name="nics")]), timeout=10)
    assert [list(d.cdi_device_ids) for d in beta.claims[uid].devices] == [
        list(d.cdi_device_ids) for d in first.claims[uid].devices]
    assert len(rig.specs()) == 1


def test_unprepare_removes_spec_and_record_and_unknown_claim_succeeds(rig: Rig) -> None:
    uid = rig.api.add_claim("default", "nics", [("nic", "bond0")])["metadata"]["uid"]
    rig.prepare(("default", uid, "nics"))
    unknown = "0b0e5c1e-0000-4000-8000-000000000000"
    resp = rig.unprepare(("default", uid, "nics"), ("default", unknown, "never-prepared"))
    assert set(resp.claims) == {uid, unknown}
    assert resp.claims[uid].error == "" and resp.claims[unknown].error == ""
    assert rig.specs() == [] and rig.driver.records.get(uid) is None
    assert rig.unprepare(("default", uid, "nics")).claims[uid].error == ""  # twice is fine


def test_every_claim_gets_an_answer_and_failures_say_why(rig: Rig) -> None:
    good = rig.api.add_claim("default", "good", [("nic", "bond0")])["metadata"]["uid"]
    stale = rig.api.add_claim("default", "recreated", [("nic", "bond1")])
    unallocated = rig.api.add_claim("default", "pending", [("nic", "bond2")], allocated=False)
    foreign = rig.api.add_claim("default", "other-node", [("nic", "bond3")], node="node-b")
    gone = "5a1f0000-0000-4000-8000-000000000001"
    other_uid = "4e110000-0000-4000-8000-000000000002"
    resp = rig.prepare(("default", good, "good"), ("default", other_uid, "recreated"),
                       ("default", unallocated["metadata"]["uid"], "pending"),
                       ("default", foreign["metadata"]["uid"], "other-node"), ("default", gone, "missing"))
    assert len(resp.claims) == 5
    assert resp.claims[good].error == "" and len(resp.claims[good].devices) == 1
    assert resp.claims["4e110000-0000-4000-8000-000000000002"].error.startswith("FAILED_PRECONDITION: ")
    assert stale["metadata"]["uid"] in resp.claims["4e110000-0000-4000-8000-000000000002"].error
    assert "not allocated" in resp.claims[unallocated["metadata"]["uid"]].error
    assert list(resp.claims[foreign["metadata"]["uid"]].devices) == []  # nothing of ours on this node
    assert resp.claims[gone].error.startswith("NOT_FOUND: ResourceClaim default/missing")
    assert rig.specs() == [f"rdma.tke.cloud.tencent.com-bond_{good}.json"]


def test_prepare_refuses_a_bond_that_went_unhealthy_and_writes_nothing(rig: Rig) -> None:
    rig.board.publish(snapshot(unhealthy="mlx5_bond_2"))
    uid = rig.api.add_claim("default", "nics", [("nic", "bond1"), ("nic", "bond2")])["metadata"]["uid"]
    err = rig.prepare(("default", uid, "nics")).claims[uid].error
    assert err.startswith("FAILED_PRECONDITION: ") and "mlx5_bond_2" in err and "bond is down" in err
    assert rig.specs() == []
    assert rig.driver.records.get(uid) is None


def test_api_server_outage_is_unavailable_and_the_retry_succeeds(rig: Rig) -> None:
    uid = rig.api.add_claim("default", "nics", [("nic", "bond0")])["metadata"]["uid"]
    rig.api.fail_next = [503] * 3
    assert rig.prepare(("default", uid, "nics")).claims[uid].error.startswith("UNAVAILABLE: ")
    assert rig.prepare(("default", uid, "nics")).claims[uid].error == ""


@pytest.mark.parametrize("rig", [SHARED], indirect=True)
def test_shared_mode_gives_no_gid_index_env(rig: Rig) -> None:
    uid = rig.api.add_claim("default", "all", [("all", f"bond{i}") for i in range(4)])["metadata"]["uid"]
    assert rig.prepare(("default", uid, "all")).claims[uid].error == ""
    doc = json.loads((rig.cdi / rig.specs()[0]).read_text())
    names = {e.split("=", 1)[0] for e in doc["containerEdits"]["env"]}
    assert names == {"NCCL_IB_HCA", "UCX_NET_DEVICES"}


def test_publisher_creates_updates_only_on_change_and_deletes_extra_slices(tmp_path: Path) -> None:
    facts = {b.id: BondFacts("Ethernet", 3, "198.51.100.0/28") for b in bonds()}
    with DraApi(Pki(tmp_path / "pki"), node=NODE) as api:
        client = ResourceClient(kubeconfig.load(str(api.kubeconfig(tmp_path / "kc"))), timeout=5)
        pub = SlicePublisher(client, NODE)
        assert pub.publish(slice_specs(NODE, snapshot(), facts, None)) is True
        [obj] = api.slices.values()
        assert obj["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": api.node_uid, "controller": True}]
        assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        assert pub.publish(slice_specs(NODE, snapshot(), facts, None)) is False  # same content: no write
        assert pub.publish(slice_specs(NODE, snapshot(unhealthy="mlx5_bond_3"), facts, None)) is True
        [obj] = api.slices.values()
        assert obj["spec"]["pool"]["generation"] == 2
        assert obj["spec"]["devices"][3]["taints"][0]["key"] == f"{DRIVER}/unhealthy"
        # A slice of an earlier run with more devices than now: removed by the next run, which lists.
        extra = f"{NODE}-{DRIVER}-1"
        api.slices[extra] = {"metadata": {"name": extra, "resourceVersion": "1"},
                             "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"generation": 2}}}
        pub = SlicePublisher(client, NODE)
        assert pub.publish(slice_specs(NODE, snapshot(), facts, None)) is True
        assert list(api.slices) == [f"{NODE}-{DRIVER}-0"]
        assert api.slices[f"{NODE}-{DRIVER}-0"]["spec"]["pool"]["generation"] == 3
        assert [m for m, _ in api.slice_writes] == ["POST", "PUT", "PUT", "DELETE"]


def test_health_stream_sends_every_device_then_each_change_in_v1_and_v1alpha1(rig: Rig) -> None:
    v1 = drahealth_v1_pb2_grpc.DRAResourceHealthStub(rig.channel).NodeWatchResources(
        drahealth_v1_pb2.NodeWatchResourcesRequest(), timeout=30)
    alpha = drahealth_v1alpha1_pb2_grpc.DRAResourceHealthStub(rig.channel).NodeWatchResources(
        drahealth_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=30)
    for stream, pb in ((v1, drahealth_v1_pb2), (alpha, drahealth_v1alpha1_pb2)):
        first = next(stream)
        assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices] == [
            (NODE, f"bond{i}", pb.HEALTHY) for i in range(4)]
        assert all(d.health_check_timeout_seconds == 30 and d.last_updated_time > 0 for d in first.devices)
    rig.board.publish(snapshot(unhealthy="mlx5_bond_2"))
    for stream, pb in ((v1, drahealth_v1_pb2), (alpha, drahealth_v1alpha1_pb2)):
        changed = next(stream)
        bad = [(d.device.device_name, d.message) for d in changed.devices if d.health == pb.UNHEALTHY]
        assert bad == [("bond2", "bond is down")]
    v1.cancel()
    alpha.cancel()


def test_a_node_error_fails_only_that_claim_with_internal(rig: Rig) -> None:
    uid = rig.api.add_claim("default", "nics", [("nic", "bond0")])["metadata"]["uid"]
    rig.cdi.write_text("a file where the CDI directory should be")
    err = rig.prepare(("default", uid, "nics")).claims[uid].error
    assert err.startswith("INTERNAL: ")
    rig.cdi.unlink()
    assert rig.prepare(("default", uid, "nics")).claims[uid].error == ""  # kubelet's retry


def test_slices_are_published_without_owner_when_the_node_cannot_be_read(tmp_path: Path) -> None:
    with DraApi(Pki(tmp_path / "pki"), node="another-node") as api:
        client = ResourceClient(kubeconfig.load(str(api.kubeconfig(tmp_path / "kc"))), timeout=5)
        assert SlicePublisher(client, NODE).publish(slice_specs(NODE, snapshot(), {}, None)) is True
        [obj] = api.slices.values()
        assert "ownerReferences" not in obj["metadata"] and len(obj["spec"]["devices"]) == 4
