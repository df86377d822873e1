"""A stand-in GPU DRA driver (``gpu.nvidia.com``, the name NVIDIA's GPU DRA driver uses) for the test
cluster's kubelets.

Why it exists: a claim that aligns GPUs and RDMA bonds (``matchAttribute:
resource.kubernetes.io/pcieRoot``) needs GPUs in ResourceSlices with the standard attributes, and the
machines here have none. It publishes the 8 GPUs of :func:`cluster.gpu_plugin.layout` (root ``r``
holds GPUs ``2r, 2r+1``, as the simulated node's root ``r`` holds bonds ``2r, 2r+1``), each with
``resource.kubernetes.io/pcieRoot``, ``resource.kubernetes.io/pciBusID`` (a made-up function under
its root) and ``resource.kubernetes.io/numaNode``, registers with kubelet's plugin watcher as a
``DRAPlugin``, and answers NodePrepareResources with a CDI device per allocated GPU from one static
spec (env only: ``GPU_<i>_PCIE_ROOT``), so containerd starts the container and a test can read what
it got. It is test infrastructure: it publishes once at start (its devices never change) and holds
no state across restarts (a GPU claim has nothing to undo).

    PYTHONPATH=tests:. python -m cluster.gpu_dra --node rcl-node1 --kubeconfig admin.kubeconfig
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from concurrent import futures
from typing import Any

import grpc

from cluster.gpu_plugin import Gpu, layout
from rdma_cni.cni.errors import CniError
from rdma_cni.dra.kubeapi import ResourceClient
from rdma_cni.kube import kubeconfig
from rdma_cni.proto import dra_v1_pb2, dra_v1_pb2_grpc
from rdma_cni.proto import pluginregistration_v1_pb2 as reg_pb
from rdma_cni.proto import pluginregistration_v1_pb2_grpc as reg_grpc

log = logging.getLogger("gpu_dra")

DRIVER = "gpu.nvidia.com"
CDI_KIND = "nvidia.com/gpu"
DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}


def bus_id(gpu: Gpu) -> str:
    """A PCI address under the GPU's root bus (``pci0000:40`` -> ``0000:41:0<i>.0``), after the
    simulated bonds' functions (which sit on the root's bus itself)."""
    domain, bus = gpu.root.removeprefix("pci").split(":")
    return f"{domain}:{int(bus, 16) + 1:02x}:{gpu.index % 32:02x}.0"


def slice_doc(node: str, node_uid: str, gpus: list[Gpu]) -> dict[str, Any]:
    devices = [
        {
            "name": g.id,
            "attributes": {
                "resource.kubernetes.io/pcieRoot": {"string": g.root},
                "resource.kubernetes.io/pciBusID": {"string": bus_id(g)},
                "resource.kubernetes.io/numaNode": {"int": g.numa},
                "index": {"int": g.index},
            },
        }
        for g in gpus
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-{DRIVER}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def cdi_spec(gpus: list[Gpu]) -> dict[str, Any]:
    return {
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": [
            {"name": g.id, "containerEdits": {"env": [f"GPU_{g.index}_PCIE_ROOT={g.root}"]}} for g in gpus
        ],
    }


def write_cdi(cdi_dir: str, gpus: list[Gpu]) -> None:
    os.makedirs(cdi_dir, exist_ok=True)
    path = os.path.join(cdi_dir, "nvidia.com-gpu.json")
    with open(path + ".tmp", "w") as f:
        json.dump(cdi_spec(gpus), f)
    os.rename(path + ".tmp", path)


class GpuApi(ResourceClient):
    def publish(self, doc: dict[str, Any]) -> None:
        """Replace the node's GPU slice (delete, then create: its content never changes here)."""
        self.delete_slice(doc["metadata"]["name"])
        self.create_slice(doc)


class GpuDra(dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, api: ResourceClient, node: str) -> None:
        self._api = api
        self._node = node

    def _devices(self, namespace: str, name: str) -> list[dict[str, str]]:
        claim = self._api.get_claim(namespace, name)
        if claim is None:
            raise LookupError(f"ResourceClaim {namespace}/{name} not found")
        results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        return [r for r in results if r.get("driver") == DRIVER and r.get("pool") == self._node]

    def NodePrepareResources(
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        out = dra_v1_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            entry = out.claims[c.uid]
            try:
                for r in self._devices(c.namespace, c.name):
                    entry.devices.add(
                        request_names=[r["request"]],
                        pool_name=r["pool"],
                        device_name=r["device"],
                        cdi_device_ids=[f"{CDI_KIND}={r['device']}"],
                    )
            except (LookupError, CniError) as e:
                entry.error = str(e)
            log.info("prepared %s/%s: %s", c.namespace, c.name, [d.device_name for d in entry.devices])
        return out

    def NodeUnprepareResources(
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        out = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for c in request.claims:
            out.claims[c.uid].SetInParent()
        return out


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint

    def GetInfo(self, request: reg_pb.InfoRequest, context: grpc.ServicerContext) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type="DRAPlugin", name=DRIVER, endpoint=self._endpoint, supported_versions=["v1.DRAPlugin"]
        )

    def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb.RegistrationStatusResponse:
        log.info("kubelet registration: %s %s", request.plugin_registered, request.error)
        return reg_pb.RegistrationStatusResponse()


def serve(servicer: Any, add: Any, path: str) -> grpc.Server:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_dra")
    ap.add_argument("--node", required=True)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--kubelet-root-dir", default="/var/lib/kubelet")
    ap.add_argument("--cdi-dir", default="/var/run/cdi")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    gpus = layout()
    api = GpuApi(kubeconfig.load(args.kubeconfig))
    node = api.get_node(args.node)
    if node is None:
        log.error("node %s not found", args.node)
        return 1
    write_cdi(args.cdi_dir, gpus)
    api.publish(slice_doc(args.node, node["metadata"]["uid"], gpus))
    dra_sock = os.path.join(args.kubelet_root_dir, "plugins", DRIVER, "dra.sock")
    reg_sock = os.path.join(args.kubelet_root_dir, "plugins_registry", f"{DRIVER}-reg.sock")
    servers = [
        serve(GpuDra(api, args.node), dra_v1_pb2_grpc.add_DRAPluginServicer_to_server, dra_sock),
        serve(Registration(dra_sock), reg_grpc.add_RegistrationServicer_to_server, reg_sock),
    ]
    log.info("serving %d GPUs on %s", len(gpus), args.node)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    for s in servers:
        s.stop(1).wait()
    for p in (reg_sock, dra_sock):
        if os.path.exists(p):
            os.unlink(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
