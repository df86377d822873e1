"""A pod's DRA devices as kubelet reports them: the PodResources client against the test kubelet
speaking the real v1 API (``ContainerResources.dynamic_resources``) over a real unix socket, and
kubelet's DRA checkpoint (``<root-dir>/dra_manager_state``) as kubelet 1.31-1.37 writes it."""

from __future__ import annotations

import json
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdma_cni.cni.errors import STATE_CORRUPT, CniError
from rdma_cni.devices.dra_names import DRIVER
from rdma_cni.kube import dra_checkpoint, podresources
from rdma_cni.kube.podresources import ClaimDevice
from tests.podresources_server import PodResourcesServer
from tests.podresources_server import claim as dra_claim
from tests.podresources_server import device as dra_device

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
GPU = "gpu.nvidia.com"
EXTENDED = "ibv-app-0-extended-resources-x7k2p"  # the scheduler's generateName: <pod>-extended-resources-


@pytest.fixture
def short_dir() -> Iterator[str]:
    """A unix socket path must fit in 108 bytes: pytest's tmp_path may not."""
    d = tempfile.mkdtemp(prefix="h29-pr-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_get_reports_each_claim_device_once_with_its_driver_pool_and_share(short_dir: str) -> None:
    rdma = dra_claim(
        "default", "rdma", dra_device(DRIVER, "node-1", "bond1"), dra_device(GPU, "node-1", "gpu-0")
    )
    shared = dra_claim("default", "all-bonds", dra_device(DRIVER, "node-1", "bond0", share_id="5f0c-1"))
    with PodResourcesServer(podresources.socket_path(short_dir)) as kubelet:
        # Both containers name claim "rdma": kubelet reports it whole in each.
        kubelet.set_pod("default", "dra-0", {"trainer": {}, "sidecar": {}},
                        claims={"trainer": [rdma, shared], "sidecar": [rdma]})  # fmt: skip
        got = podresources.pod_allocation(kubelet.socket, "default", "dra-0")
        assert kubelet.calls == ["Get"]
    assert got is not None and got.devices == {}
    assert got.claims == (
        ClaimDevice("default", "rdma", DRIVER, "node-1", "bond1"),
        ClaimDevice("default", "rdma", GPU, "node-1", "gpu-0"),
        ClaimDevice("default", "all-bonds", DRIVER, "node-1", "bond0", "5f0c-1"),
    )
    assert [c.device for c in got.of_driver(DRIVER)] == ["bond1", "bond0"]


def test_the_extended_resource_claim_is_a_claim_not_devices_of_the_resource(short_dir: str) -> None:
    """KEP-5004: kubelet's device manager skips a DRA-backed extended resource, so the pod's
    ``tke-shared-rdma: 2`` shows up only as the special claim, in each container that asked."""
    special = dra_claim("default", EXTENDED, *(dra_device(DRIVER, "node-1", f"bond{i}") for i in (2, 6)))
    with PodResourcesServer(podresources.socket_path(short_dir)) as kubelet:
        kubelet.set_pod("default", "ibv-app-0", {"trainer": {}, "init": {"nvidia.com/gpu": ["GPU-a"]}},
                        claims={"trainer": [special], "init": [special]})  # fmt: skip
        got = podresources.pod_allocation(kubelet.socket, "default", "ibv-app-0")
        devices = podresources.pod_devices(kubelet.socket, "default", "ibv-app-0")
    assert got is not None
    assert [(c.claim_name, c.device) for c in got.claims] == [(EXTENDED, "bond2"), (EXTENDED, "bond6")]
    assert devices == {"nvidia.com/gpu": ["GPU-a"]}  # no RESOURCE entry: the claim is the only trace


@pytest.mark.parametrize("get", ["absent", "disabled"])
def test_a_kubelet_answering_by_list_reports_the_claims_too(short_dir: str, get: str) -> None:
    with PodResourcesServer(podresources.socket_path(short_dir), get=get) as kubelet:
        kubelet.set_pod("default", "other", {"c": {RESOURCE: ["mlx5_bond_0"]}})
        rdma = dra_claim("default", "rdma", dra_device(DRIVER, "n", "bond3"))
        kubelet.set_pod("default", "dra-0", {"c": {}}, claims={"c": [rdma]})
        got = podresources.pod_allocation(kubelet.socket, "default", "dra-0")
        assert kubelet.calls[-1] == "List"
    assert got is not None and [c.device for c in got.claims] == ["bond3"]


# --- kubelet's DRA checkpoint -------------------------------------------------------------------------


def write_checkpoint(root: Path, claims: list[dict[str, Any]], checksum: int | None = None,
                     kind: str = dra_checkpoint.KIND) -> Path:  # fmt: skip
    """``dra_manager_state`` as kubelet's checkpoint manager writes it: Data is compact JSON text,
    Checksum the CRC-32 (IEEE) of that text, as ``hash/crc32.ChecksumIEEE`` in Go."""
    data = json.dumps({"kind": kind, "apiVersion": dra_checkpoint.API_VERSION, "ClaimInfoStateList": claims},
                      separators=(",", ":"))  # fmt: skip
    path = root / dra_checkpoint.CHECKPOINT
    crc = zlib.crc32(data.encode()) if checksum is None else checksum
    path.write_text(json.dumps({"Data": data, "Checksum": crc}, separators=(",", ":")))
    return path


def claim_state(name: str, pods: list[str], drivers: dict[str, list[str]], share: str | None = None) -> (
    dict[str, Any]
):  # fmt: skip
    def state(driver: str, names: list[str]) -> dict[str, Any]:
        return {"Devices": [{"PoolName": "node-1", "DeviceName": n, "ShareID": share, "RequestNames": ["r"],
                             "CDIDeviceIDs": [f"{driver}/x={n}"]} for n in names]}  # fmt: skip

    devices = {d: state(d, names) for d, names in drivers.items()}
    return {"ClaimUID": f"uid-{name}", "ClaimName": name, "Namespace": "default",
            "PodUIDs": {p: {} for p in pods}, "DriverState": devices}  # fmt: skip


def test_the_dra_checkpoint_gives_the_pods_claim_devices_by_pod_uid(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, [
        claim_state("rdma", ["u-1"], {DRIVER: ["bond1", "bond4"], GPU: ["gpu-3"]}),
        claim_state("theirs", ["u-2"], {DRIVER: ["bond0"]}),
        claim_state("all-bonds", ["u-1", "u-3"], {DRIVER: ["bond0"]}, share="7a1e"),
    ])  # fmt: skip
    got = dra_checkpoint.pod_claim_devices(str(tmp_path), "u-1")
    assert got == [
        ClaimDevice("default", "rdma", GPU, "node-1", "gpu-3"),  # drivers in Go's (sorted) map order
        ClaimDevice("default", "rdma", DRIVER, "node-1", "bond1"),
        ClaimDevice("default", "rdma", DRIVER, "node-1", "bond4"),
        ClaimDevice("default", "all-bonds", DRIVER, "node-1", "bond0", "7a1e"),
    ]
    assert dra_checkpoint.pod_claim_devices(str(tmp_path), "u-9") == []


def test_no_dra_checkpoint_or_classic_dras_form_means_no_claims(tmp_path: Path) -> None:
    assert dra_checkpoint.pod_claim_devices(str(tmp_path), "u-1") == []
    # Kubernetes <= 1.30 (classic DRA, which no driver of ours can serve): not an error.
    (tmp_path / dra_checkpoint.CHECKPOINT).write_text('{"version":"v1","checksum":1234}')
    assert dra_checkpoint.pod_claim_devices(str(tmp_path), "u-1") == []


@pytest.mark.parametrize(
    ("break_it", "says"),
    [
        (lambda p: write_checkpoint(p, [claim_state("rdma", ["u-1"], {DRIVER: ["bond1"]})], checksum=1),
         "fails its checksum"),
        (lambda p: write_checkpoint(p, [], kind="DRACheckpointV2"), "is kind 'DRACheckpointV2'"),
        (lambda p: (p / dra_checkpoint.CHECKPOINT).write_text("{"), "cannot be read"),
        (lambda p: (p / dra_checkpoint.CHECKPOINT).write_text('{"Data": 3}'), "has no Data text"),
    ],
)  # fmt: skip
def test_a_dra_checkpoint_of_unknown_form_is_one_error_naming_it_and_the_fix(
    tmp_path: Path, break_it: Any, says: str
) -> None:
    break_it(tmp_path)
    with pytest.raises(CniError) as caught:
        dra_checkpoint.pod_claim_devices(str(tmp_path), "u-1")
    err = caught.value
    assert err.code == STATE_CORRUPT and says in err.msg, err.msg
    assert str(tmp_path / dra_checkpoint.CHECKPOINT) in err.msg and "PodResources" in err.msg, err.msg
