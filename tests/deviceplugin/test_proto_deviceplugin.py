"""The generated kubelet device-plugin stubs: up to date with the .proto, and the wire contract kubelet
speaks (package v1beta1 in the method paths, the field numbers of deviceplugin-facts.md section 1.3)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rdma_cni.proto import deviceplugin_v1beta1_pb2 as pb

REPO = Path(__file__).resolve().parents[2]

# message -> {field: number}, from kubelet's api.proto (deviceplugin-facts.md 1.3).
FIELDS = {
    "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
    "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
    "Empty": {},
    "ListAndWatchResponse": {"devices": 1},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "Device": {"ID": 1, "health": 2, "topology": 3},
    "PreStartContainerRequest": {"devices_ids": 1},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {"container_requests": 1},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3},
    "PreferredAllocationResponse": {"container_responses": 1},
    "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
    "AllocateRequest": {"container_requests": 1},
    "ContainerAllocateRequest": {"devices_ids": 1},
    "CDIDevice": {"name": 1},
    "AllocateResponse": {"container_responses": 1},
    "ContainerAllocateResponse": {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
    "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
    "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
}


def test_generated_stubs_match_the_proto() -> None:
    out = subprocess.run([str(REPO / "scripts/gen-proto"), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_field_numbers_are_kubelets() -> None:
    got = {
        name: {f.name: f.number for f in msg.fields}
        for name, msg in pb.DESCRIPTOR.message_types_by_name.items()
    }
    assert got == FIELDS


def test_method_paths_are_kubelets() -> None:
    services = pb.DESCRIPTOR.services_by_name
    paths = sorted(f"/{s.full_name}/{m.name}" for s in services.values() for m in s.methods)
    assert paths == [
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/PreStartContainer",
        "/v1beta1.Registration/Register",
    ]
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming


def test_envs_is_a_string_map_on_the_wire() -> None:
    """A map<string,string> round-trips through bytes the way kubelet's checkpoint stores AllocResp."""
    resp = pb.ContainerAllocateResponse(envs={"NCCL_IB_HCA": "=mlx5_bond_0"})
    resp.devices.add(container_path="/dev/infiniband/uverbs0", host_path="/dev/infiniband/uverbs0",
                     permissions="rw")
    back = pb.ContainerAllocateResponse.FromString(resp.SerializeToString())
    assert dict(back.envs) == {"NCCL_IB_HCA": "=mlx5_bond_0"}
    assert back.devices[0].host_path == "/dev/infiniband/uverbs0"
