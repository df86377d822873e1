"""Which GPU and RDMA NIC of a container share a PCIe root, as a pure function (doctor/alignment.py)
and the doctor's lines from it (doctor/pod_checks.py): table cases on the test cluster's layout, 8
bonds and 8 GPUs, root r holding bonds 2r, 2r+1 and GPUs 2r, 2r+1, roots 0-1 on NUMA 0, 2-3 on
NUMA 1. No sockets."""

from __future__ import annotations

import pytest

from rdma_cni.doctor.alignment import (
    NO_GPU,
    NO_NIC,
    NUMA,
    ROOT,
    ROOT_UNKNOWN_PLUGIN,
    UNALIGNED,
    UNKNOWN,
    Container,
    ContainerAlignment,
    DeviceFacts,
    Kinds,
    NodeBond,
    Place,
    align,
)
from rdma_cni.doctor.findings import OK, SKIP, WARN
from rdma_cni.doctor.pod_checks import container_lines
from rdma_cni.kube.podresources import ClaimDevice

GPU_DRIVER, NIC_DRIVER, POOL = "gpu.nvidia.com", "rdma.tke.cloud.tencent.com", "node-a"
RDMA = "tke.cloud.tencent.com/tke-shared-rdma"
ROOTS = ("pci0000:00", "pci0000:20", "pci0000:40", "pci0000:60")


def place(i: int) -> Place:
    """Bond i's and GPU i's place: root i // 2, NUMA i // 4."""
    return Place((ROOTS[i // 2],), (i // 4,))


BONDS = [NodeBond(f"bond{i}", f"mlx5_bond_{i}", f"bond{i}", place(i)) for i in range(8)]
FACTS = {
    **{(GPU_DRIVER, POOL, f"gpu-{i}"): DeviceFacts(place(i), f"0000:{0x21 + i:02x}:00.0") for i in range(8)},
    **{(NIC_DRIVER, POOL, f"bond{i}"): DeviceFacts(place(i), bond=f"bond{i}") for i in range(8)},
}


def claim(driver: str, device: str, name: str = "pairs") -> ClaimDevice:
    return ClaimDevice("default", name, driver, POOL, device)


def dra(gpus: list[int], nics: list[int]) -> Container:
    """A container whose one claim holds GPUs and bonds by index."""
    return Container("default/p", "main", {}, [claim(GPU_DRIVER, f"gpu-{g}") for g in gpus]
                     + [claim(NIC_DRIVER, f"bond{n}") for n in nics])


Facts = dict[tuple[str, str, str], DeviceFacts]
PLAIN = Kinds()


def one(c: Container, facts: Facts = FACTS, kinds: Kinds = PLAIN, slices_error: str = "") -> (
    ContainerAlignment
):  # fmt: skip
    [got] = align([c], facts, BONDS, {}, kinds, slices_error)
    return got


@pytest.mark.parametrize("pairs", [1, 2, 4, 8])
def test_n_pairs_by_pcie_root_are_aligned_each_gpu_with_its_own_root_nic(pairs: int) -> None:
    """The example claims' placement: pair k = GPU and bond under the same root (spread over roots)."""
    idx = [(k % 4) * 2 + k // 4 for k in range(pairs)]  # 0, 2, 4, 6, 1, 3, 5, 7
    got = one(dra(idx, idx))
    assert got.verdict == ROOT and got.apart == ()
    for p in got.gpus:
        i = int(p.gpu.name.removeprefix("gpu-"))
        assert p.gpu.place == place(i)
        # under the root of gpu i: bond i, and bond i^1 when the pod holds it too
        assert {n.name for n in p.same_root} == {f"bond{j}" for j in idx if j // 2 == i // 2}
    lines = container_lines(got)
    every = " (every bond)" if pairs == 8 else ""  # 8 pairs hold all 8 bonds: judged the same
    assert lines[0].status == OK and lines[0].detail == f"{ROOT}: {pairs} GPU{'s' * (pairs > 1)}, " \
        f"{pairs} RDMA NIC{'s' * (pairs > 1)}{every}"
    assert [f.status for f in lines[1:]] == [OK] * pairs
    assert not any("also" in f.detail for f in lines)  # other roots' NICs are other GPUs' business
    assert "pci0000:00, NUMA 0 (claim default/pairs): under its root: bond0" in lines[1].detail


def test_one_pair_crossing_roots_on_one_numa_node_is_numa_only_and_warns_with_the_claim_fix() -> None:
    """Two pairs asked for; the second got bond1 (root 0) for gpu-2 (root 1), same NUMA node."""
    assert one(dra([0, 2], [0, 3])).verdict == ROOT  # bond3 is under gpu-2's root: the right answer
    got = one(dra([0, 2], [0, 1]))
    assert got.verdict == NUMA
    gpu2 = next(p for p in got.gpus if p.gpu.name == "gpu-2")
    assert gpu2.same_root == () and [n.name for n in gpu2.same_numa] == ["bond0", "bond1"]
    assert got.apart == ()  # bond1 shares root 0 with gpu-0
    head, g0, g2 = container_lines(got)
    assert head.status == WARN and "matchAttribute" in head.fix and "pcieRoot" in head.fix
    assert g0.status == OK and g2.status == WARN
    assert g2.detail.endswith("no RDMA NIC under its root; on its NUMA node: bond0, bond1")


def test_a_pair_across_numa_nodes_is_unaligned_and_names_the_nic_apart() -> None:
    got = one(dra([0, 1], [0, 6]))
    assert got.verdict == UNALIGNED
    assert [n.name for n in got.apart] == ["bond6"]
    lines = container_lines(got)
    assert lines[0].status == WARN and lines[0].detail.startswith(UNALIGNED)
    assert lines[-1].check.endswith("NICs apart") and "bond6 (pci0000:60, NUMA 1, claim default/pairs)" \
        in lines[-1].detail


def test_every_nic_of_the_gpus_numa_node_is_numa_only_without_warning() -> None:
    """The example claim for all NICs of one NUMA node: the GPU has NICs under its root, the others
    beside it on the node are apart by root but not far."""
    got = one(dra([0], [0, 1, 2, 3]))
    assert got.verdict == NUMA
    assert [n.name for n in got.gpus[0].same_root] == ["bond0", "bond1"]
    assert [n.name for n in got.gpus[0].same_numa] == ["bond2", "bond3"]
    assert [n.name for n in got.apart] == ["bond2", "bond3"]
    head, gpu0, apart = container_lines(got)
    assert head.status == OK and gpu0.status == OK and apart.status == OK
    assert gpu0.detail.endswith("under its root: bond0, bond1; also on its NUMA node: bond2, bond3")


def test_device_plugin_gpus_by_uuid_are_judged_by_numa_and_their_root_is_unknown() -> None:
    """NVIDIA's device plugin names GPUs by UUID: kubelet's topology gives NUMA, nothing gives root.
    The bonds come from rdma-device-plugin, named by RDMA device; their places from sysfs."""
    uuids = [f"GPU-{i}aa0c1f2-0000-0000-0000-00000000000{i}" for i in range(4)]
    c = Container("default/ibv-app-0", "trainer",
                  {"nvidia.com/gpu": uuids, RDMA: [f"mlx5_bond_{i}" for i in range(4)]},
                  numa={u: (0,) for u in uuids})
    got = one(c)
    assert got.verdict == NUMA and got.apart == ()
    assert all(p.gpu.place == Place((), (0,)) and p.gpu.unknown == ROOT_UNKNOWN_PLUGIN for p in got.gpus)
    assert [n.name for n in got.gpus[0].same_numa] == ["bond0", "bond1", "bond2", "bond3"]
    lines = container_lines(got)
    assert lines[0].status == OK  # NUMA is all a device plugin can promise; nothing to fix here
    assert lines[1].detail == f"{ROOT_UNKNOWN_PLUGIN}, NUMA 0 (nvidia.com/gpu): on its NUMA node: " \
        "bond0, bond1, bond2, bond3"  # fmt: skip
    # the same GPUs on the other NUMA node: unaligned
    far = Container("default/ibv-app-1", "trainer", c.devices, numa={u: (1,) for u in uuids})
    assert one(far).verdict == UNALIGNED


def test_device_plugin_gpu_named_by_pci_address_gets_its_root_from_sysfs() -> None:
    c = Container("default/p", "main", {"nvidia.com/gpu": ["0000:21:00.0"], RDMA: ["mlx5_bond_0"]})
    [got] = align([c], FACTS, BONDS, {"0000:21:00.0": place(0)}, Kinds())
    assert got.verdict == ROOT and got.gpus[0].gpu.unknown == ""


def test_gpus_without_topology_cannot_be_judged() -> None:
    c = Container("default/p", "main", {"nvidia.com/gpu": ["GPU-x"], RDMA: ["mlx5_bond_0"]})
    got = one(c)
    assert got.verdict == UNKNOWN
    assert container_lines(got)[0].status == SKIP


def test_dra_gpu_without_its_slice_says_why_and_is_unknown() -> None:
    got = one(dra([0], [0]), facts={}, slices_error="ResourceSlices not read: forbidden")
    assert got.verdict == UNKNOWN
    assert got.gpus[0].gpu.unknown == "ResourceSlices not read: forbidden"
    # our own NIC is still placed, from sysfs, by its DRA device name
    assert got.nics[0].place == place(0) and got.nics[0].name == "bond0"
    got = one(dra([0], [0]), facts={})
    assert got.gpus[0].gpu.unknown == f"no ResourceSlice of {GPU_DRIVER} pool {POOL} lists it"


def test_dra_gpu_bus_id_fills_the_numa_node_its_slice_leaves_out() -> None:
    facts = {**FACTS, (GPU_DRIVER, POOL, "gpu-0"): DeviceFacts(Place((ROOTS[0],)), "0000:21:00.0")}
    [got] = align([dra([0], [0])], facts, BONDS, {"0000:21:00.0": place(0)}, Kinds())
    assert got.gpus[0].gpu.place == place(0)


def test_list_attributes_meet_when_they_share_a_value() -> None:
    facts = {**FACTS, (GPU_DRIVER, POOL, "gpu-0"): DeviceFacts(Place((ROOTS[3], ROOTS[0]), (1, 0)))}
    assert one(dra([0], [0]), facts=facts).verdict == ROOT


def test_pods_without_rdma_or_gpus_are_left_out_and_one_sided_pods_are_shown() -> None:
    plain = Container("default/web", "nginx", {"example.com/foo": ["x"]})
    gpu_only = Container("default/cuda", "main", {"nvidia.com/gpu": ["GPU-a"]}, numa={"GPU-a": (0,)})
    nic_only = Container("default/ibv", "main", {RDMA: ["mlx5_bond_5"]})
    got = align([plain, gpu_only, nic_only], FACTS, BONDS, {}, Kinds())
    assert [(a.pod, a.verdict) for a in got] == [("default/cuda", NO_NIC), ("default/ibv", NO_GPU)]
    assert container_lines(got[1])[0].detail == f"{NO_GPU}: bond5 (pci0000:40, NUMA 1)"
    assert all(f.status == OK for a in got for f in container_lines(a))


def test_shared_pool_ids_name_no_bond_and_mean_every_bond() -> None:
    c = Container("default/shared", "main", {RDMA: ["17"], "nvidia.com/gpu": ["GPU-a"]}, numa={"GPU-a": (1,)})
    got = one(c, kinds=Kinds(shared_resources=frozenset({RDMA})))
    # every bond: those on NUMA 0 are far from the GPU, but the pod did not choose them
    assert len(got.nics) == 8 and got.every_bond and got.apart == () and got.verdict == NUMA
    assert [n.name for n in got.gpus[0].same_numa] == [f"bond{i}" for i in range(4, 8)]
    far = Container("default/shared", "main", c.devices, numa={"GPU-a": (2,)})
    assert one(far, kinds=Kinds(shared_resources=frozenset({RDMA}))).verdict == UNALIGNED
    assert one(c).verdict == NO_NIC  # not known as shared: "17" names nothing


def test_a_dra_claim_for_every_bond_is_judged_by_its_gpus() -> None:
    """Shared mode by claim (allocationMode: All): every bond; a DRA GPU under root 3 has bonds 6, 7."""
    got = one(dra([6], list(range(8))))
    assert got.every_bond and got.verdict == ROOT and got.apart == ()
    assert [n.name for n in got.gpus[0].same_root] == ["bond6", "bond7"]
    assert container_lines(got)[0].detail == f"{ROOT}: 1 GPU, 8 RDMA NICs (every bond)"
    assert one(dra([6], list(range(7)))).verdict == UNALIGNED  # 7 of 8 were chosen: bond0 is far


def test_containers_are_judged_apart_and_a_shared_claim_counts_once() -> None:
    a = Container("default/p", "a", {}, [claim(GPU_DRIVER, "gpu-0"), claim(NIC_DRIVER, "bond0")])
    b = Container("default/p", "b", {}, [claim(GPU_DRIVER, "gpu-6"), claim(NIC_DRIVER, "bond0"),
                                         claim(NIC_DRIVER, "bond0", name="again")])
    got = align([a, b], FACTS, BONDS, {}, Kinds())
    assert [(x.container, x.verdict, len(x.nics)) for x in got] == [("a", ROOT, 1), ("b", UNALIGNED, 1)]
