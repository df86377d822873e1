"""Bond selection: device IDs as netdev, RDMA device or PCI address (of a lower NIC or of the RDMA
device), opaque IDs as a count, pins, and error 11 naming who holds what. The sysfs layout is built
the way the kernel lays it out (class/net/<bond>/lower_<nic> -> ../<nic>, <nic>/device -> PCI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdma_cni.cni.errors import CniError
from rdma_cni.cni.request import Attachment, Request
from rdma_cni.kube.allocated import DeviceHolders
from rdma_cni.plugins.macvlan.select import aliases, choose_bonds

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"


def sysfs(tmp_path: Path) -> str:
    root = tmp_path / "sys"
    pci = root / "devices" / "pci0000:00"
    for i in range(2):
        for port in range(2):
            fn = f"0000:3b:0{i}.{port}"
            (pci / fn).mkdir(parents=True)
            nic = root / "class" / "net" / f"eth{i}{port}"
            nic.mkdir(parents=True)
            os.symlink(os.path.relpath(pci / fn, nic), nic / "device")
        bond = root / "class" / "net" / f"bond{i}"
        bond.mkdir(parents=True)
        for port in range(2):
            os.symlink(f"../eth{i}{port}", bond / f"lower_eth{i}{port}")
        ib = root / "class" / "infiniband" / f"mlx5_bond_{i}"
        ib.mkdir(parents=True)
        os.symlink(os.path.relpath(pci / f"0000:3b:0{i}.0", ib), ib / "device")
    return str(root)


def req(cid: str = "c1", **rc: object) -> Request:
    return Request(command="ADD", cni_version="1.1.0", container_id=cid, ifname="net1",
                   runtime_config=dict(rc))


def rdma_of(bond: str) -> str:
    return f"mlx5_bond_{bond[-1]}"


def choose(root: str, r: Request, pins: dict[str, Attachment] | None = None, count: int = 1) -> list[str]:
    return choose_bonds(r, ["bond0", "bond1"], count, pins or {}, lambda b: "", rdma_of, root)


def test_aliases_cover_netdev_rdma_device_and_pci_of_lowers(tmp_path: Path) -> None:
    root = sysfs(tmp_path)
    assert aliases(root, "bond1", "mlx5_bond_1") == {"bond1", "mlx5_bond_1", "0000:3b:01.0", "0000:3b:01.1"}


CLAIM_UID = "5b0f9c3e-2d41-4c8a-9e1f-0a6b7c8d9e10"


@pytest.mark.parametrize("dev_id", ["bond1", "mlx5_bond_1", "0000:3b:01.1", "0000:3b:01.0",
                                    f"{CLAIM_UID}-mlx5_bond_1"])
def test_a_device_id_names_its_bond(tmp_path: Path, dev_id: str) -> None:
    assert choose(sysfs(tmp_path), req(deviceID=dev_id)) == ["bond1"]


def test_opaque_ids_only_give_a_count(tmp_path: Path) -> None:
    assert choose(sysfs(tmp_path), req(deviceIDs=["0", "1"])) == ["bond0", "bond1"]


def test_pinned_bonds_are_skipped_and_none_free_is_error_11_naming_holders(tmp_path: Path) -> None:
    root = sysfs(tmp_path)
    pins = {"bond0": Attachment("other", "net1")}
    assert choose(root, req(), pins) == ["bond1"]
    pins["bond1"] = Attachment("third", "eth1")
    with pytest.raises(CniError) as err:
        choose(root, req(), pins)
    assert err.value.code == 11
    assert "bond0 by container other (net1)" in err.value.msg
    assert "bond1 by container third (eth1)" in err.value.msg


def test_a_named_bond_pinned_to_someone_else_is_error_11(tmp_path: Path) -> None:
    with pytest.raises(CniError) as err:
        choose(sysfs(tmp_path), req(deviceID="mlx5_bond_0"), {"bond0": Attachment("x", "net1")})
    assert err.value.code == 11 and "bond0 is pinned to container x" in err.value.msg


def test_device_ids_must_be_strings(tmp_path: Path) -> None:
    with pytest.raises(CniError) as err:
        choose(sysfs(tmp_path), req(deviceIDs=[1]))
    assert err.value.code == 7


# ------------------------------------------------------------ kubelet's allocation bounds the choice
def holders(mine: tuple[str, ...] = (), others: dict[str, str] | None = None, served: bool = True) -> (
    DeviceHolders
):  # fmt: skip
    return DeviceHolders(RESOURCE, mine, others or {}, served, "kubelet PodResources (test)")


def pod_req(cid: str = "c1", ifname: str = "net3", **rc: object) -> Request:
    args = {"K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": "ibv-app-0"}
    return Request(command="ADD", cni_version="1.1.0", container_id=cid, ifname=ifname,
                   runtime_config=dict(rc), args=args)  # fmt: skip


def choose4(root: str, r: Request, kubelet: DeviceHolders, pins: dict[str, Attachment] | None = None) -> (
    list[str]
):  # fmt: skip
    return choose_bonds(r, ["bond0", "bond1", "bond2", "bond3"], 1, pins or {}, lambda b: "", rdma_of, root,
                        kubelet)  # fmt: skip


def sysfs4(tmp_path: Path) -> str:
    root = tmp_path / "sys"
    for i in range(4):
        (root / "class" / "net" / f"bond{i}").mkdir(parents=True)
        (root / "class" / "infiniband" / f"mlx5_bond_{i}").mkdir(parents=True)
    return str(root)


def test_without_a_device_id_the_pod_gets_a_bond_of_its_own_allocation(tmp_path: Path) -> None:
    root = sysfs4(tmp_path)
    got = choose4(root, pod_req(), holders(("mlx5_bond_2", "mlx5_bond_3"), {"mlx5_bond_0": "pod default/b"}),
                  {"bond2": Attachment("c1", "net1")})  # fmt: skip
    assert got == ["bond3"]  # bond2 is this pod's net1 already; bond0 is another pod's, never a choice


def test_references_beyond_the_allocation_are_error_7_never_another_pods_bond(tmp_path: Path) -> None:
    """Found under upstream Multus v4.2.3: a pod given bond2 and bond3 referencing the NAD three times
    got bond0, which kubelet had allocated to another pod (Multus passes no deviceID to the third)."""
    root = sysfs4(tmp_path)
    pins = {"bond2": Attachment("c1", "net1"), "bond3": Attachment("c1", "net2")}
    with pytest.raises(CniError) as err:
        kubelet = holders(("mlx5_bond_2", "mlx5_bond_3"), {"mlx5_bond_0": "pod default/b"})
        choose4(root, pod_req(), kubelet, pins)
    assert err.value.code == 7
    msg = err.value.msg
    assert "pod default/ibv-app-0 was allocated 2 " + RESOURCE in msg and "bond2, bond3" in msg, msg
    assert "bond2 by container c1 (net1), bond3 by container c1 (net2) already attached" in msg, msg
    assert "reference the network at most as many times as the pod asks for " + RESOURCE in msg, msg


def test_a_pod_holding_none_of_a_served_resource_gets_no_bond(tmp_path: Path) -> None:
    with pytest.raises(CniError) as err:
        choose4(sysfs4(tmp_path), pod_req(), holders((), {"mlx5_bond_0": "pod default/b"}))
    assert err.value.code == 7
    assert "pod default/ibv-app-0 holds no " + RESOURCE + " device" in err.value.msg
    assert "request " + RESOURCE + " in the pod's spec" in err.value.msg


def test_where_kubelet_does_not_serve_the_resource_any_free_bond_is_given(tmp_path: Path) -> None:
    assert choose4(sysfs4(tmp_path), pod_req(), holders((), {}, served=False)) == ["bond0"]


def test_opaque_ids_never_take_a_bond_kubelet_gave_another_pod(tmp_path: Path) -> None:
    root = sysfs4(tmp_path)
    others = {"mlx5_bond_0": "pod default/b", "bond1": "pod default/c"}  # by RDMA device or DRA name
    assert choose4(root, pod_req(deviceIDs=["0", "1"]), holders((), others)) == ["bond2", "bond3"]
    with pytest.raises(CniError) as err:
        choose4(root, pod_req(deviceIDs=["0", "1", "2"]), holders((), others))
    assert err.value.code == 11
    msg = err.value.msg
    assert "bond0 is allocated by kubelet to pod default/b; bond1 is allocated by kubelet to" in msg, msg


def test_a_device_id_naming_no_bond_of_the_network_is_error_7(tmp_path: Path) -> None:
    with pytest.raises(CniError) as err:
        choose(sysfs(tmp_path), req(deviceID="mlx5_bond_7"))
    assert err.value.code == 7
    msg = err.value.msg
    assert "device ID 'mlx5_bond_7' names no bond of this network on this node" in msg, msg
    assert "bond0: 0000:3b:00.0, 0000:3b:00.1, mlx5_bond_0" in msg and "resourceName" in msg, msg


def test_a_claims_cdi_device_naming_another_nodes_bond_is_error_7(tmp_path: Path) -> None:
    """Multus v4.2.x passes a DRA claim's CDI device name (its part after "="): ``<uid>-<device>``
    names the bond by its RDMA device, and one that names no bond here is refused like any other."""
    with pytest.raises(CniError) as err:
        choose(sysfs(tmp_path), req(deviceID=f"{CLAIM_UID}-mlx5_bond_7"))
    assert err.value.code == 7 and f"device ID '{CLAIM_UID}-mlx5_bond_7' names no bond" in err.value.msg


def test_a_claim_id_kubelet_repeated_gives_the_next_bond_of_the_pods_own_claim(tmp_path: Path) -> None:
    """kubelet 1.37.2's PodResources reports a claim's second device with the first's CDI ID too, so
    Multus v4.2.3 passes net2 the ID of bond0, which net1 of this container already holds (found on
    the test cluster): net2 gets the claim's other bond, never another pod's."""
    root = sysfs4(tmp_path)
    kubelet = holders(("bond0", "bond1"), {"bond2": "pod default/b"})  # our DRA driver's device names
    pins = {"bond0": Attachment("c1", "net1")}
    got = choose4(root, pod_req(ifname="net2", deviceID=f"{CLAIM_UID}-mlx5_bond_0"), kubelet, pins)
    assert got == ["bond1"]


def test_a_repeated_claim_id_beyond_the_claim_is_error_7(tmp_path: Path) -> None:
    root = sysfs4(tmp_path)
    pins = {"bond0": Attachment("c1", "net1"), "bond1": Attachment("c1", "net2")}
    with pytest.raises(CniError) as err:
        choose4(root, pod_req(ifname="net3", deviceID=f"{CLAIM_UID}-mlx5_bond_1"),
                holders(("bond0", "bond1"), {"bond2": "pod default/b"}), pins)  # fmt: skip
    assert err.value.code == 7 and "already attached" in err.value.msg, err.value.msg


def test_a_claim_id_held_by_another_container_is_still_pinned_elsewhere(tmp_path: Path) -> None:
    """Only this container's own attachments make an ID a repeat: a bond another container still
    holds (a force-deleted pod's, before its DEL) is waited for as before (error 11)."""
    root = sysfs4(tmp_path)
    with pytest.raises(CniError) as err:
        choose4(root, pod_req(deviceID=f"{CLAIM_UID}-mlx5_bond_0"), holders(("bond0",), {}),
                {"bond0": Attachment("old", "net1")})  # fmt: skip
    assert err.value.code == 11


def test_without_kubelets_view_a_repeated_claim_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CniError) as err:
        r = pod_req(ifname="net2", deviceID=f"{CLAIM_UID}-mlx5_bond_0")
        choose_bonds(r, ["bond0", "bond1"], 1, {"bond0": Attachment("c1", "net1")}, lambda b: "", rdma_of,
                     sysfs4(tmp_path))  # fmt: skip
    assert err.value.code == 7 and "kubelet's allocation to the pod is unknown" in err.value.msg
