"""Which DRA devices kubelet prepared for a pod, read from its DRA manager checkpoint: the fallback
for DRA claims when kubelet's PodResources API cannot answer, as the device-manager checkpoint
(:mod:`rdma_cni.kube.checkpoint`) is for device-plugin devices.

``<kubelet --root-dir>/dra_manager_state`` (``pkg/kubelet/cm/dra/manager.go``:
``draManagerStateFileName``, in ``nodeConfig.KubeletRootDir``; it follows ``--root-dir``, unlike the
device-plugin directory). Kubelet writes it through its checkpoint manager (write to a temporary
file, then rename) before it asks a driver to prepare a claim and again with the driver's answer,
so by the time the CNI ADD runs the pod's claims are there. Its form since Kubernetes 1.31, read in
k8s.io/kubernetes@v1.31.0, @v1.34.0 and @v1.37.2 (``pkg/kubelet/cm/dra/state``)::

    {"Data": "<JSON text>", "Checksum": <CRC-32 (IEEE) of the Data text>}
    Data = {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
            "ClaimInfoStateList": [{"ClaimUID", "ClaimName", "Namespace", "PodUIDs": {"<uid>": {}},
                                    "DriverState": {"<driver>": {"Devices": [{"PoolName",
                                        "DeviceName", "ShareID", "RequestNames", "CDIDeviceIDs"}]}}}]}

Between 1.31 and 1.37 fields were only added (``ShareID`` after 1.34, ``SkipNodeOperations`` in
1.37), which this reader ignores or accepts absent. It is kubelet's internal file, not an API: its
shape changed once before under the same version string (1.30 wrote ``{"version": "v1",
"entries": [...], "checksum": N}`` for classic DRA, which no driver of ours can serve: read as no
claims), and sig-node's checkpoint-manager README calls any change of a checkpoint incompatible. So
it is read strictly — the kind, the version, the checksum — and anything else is one error naming
the file and the fix (let rdma-multus reach kubelet's PodResources API), never a guess.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from typing import Any

from rdma_cni.cni.errors import STATE_CORRUPT, CniError
from rdma_cni.kube.podresources import ClaimDevice

log = logging.getLogger("rdma_cni.kube")

CHECKPOINT = "dra_manager_state"
KIND = "DRACheckpoint"
API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"


def path_of(kubelet_root_dir: str) -> str:
    return os.path.join(kubelet_root_dir, CHECKPOINT)


def pod_claim_devices(kubelet_root_dir: str, pod_uid: str) -> list[ClaimDevice]:
    """Every device of every claim kubelet prepared for pod ``pod_uid``, each once, in the
    checkpoint's order; [] when there is no checkpoint (no DRA on this kubelet) or the pod has no
    claims. Raises CniError (STATE_CORRUPT) naming the file when it is unreadable or not a form
    this reader knows."""
    path = path_of(kubelet_root_dir)
    data = _data(path)
    if data is None:
        return []
    out: dict[ClaimDevice, None] = {}
    for claim in data:
        if isinstance(claim, dict) and pod_uid in _mapping(claim.get("PodUIDs")):
            out.update(dict.fromkeys(_devices(claim)))
    return list(out)


def _devices(claim: dict[str, Any]) -> list[ClaimDevice]:
    """One claim's devices, by driver name (Go writes a map's keys sorted: so does this)."""
    namespace, name = str(claim.get("Namespace", "")), str(claim.get("ClaimName", ""))
    out = []
    for driver, state in sorted(_mapping(claim.get("DriverState")).items()):
        for dev in _mapping(state).get("Devices") or []:
            if isinstance(dev, dict):
                pool, device = str(dev.get("PoolName", "")), str(dev.get("DeviceName", ""))
                out.append(
                    ClaimDevice(namespace, name, str(driver), pool, device, str(dev.get("ShareID") or ""))
                )
    return out


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _data(path: str) -> list[Any] | None:
    """The checked ``ClaimInfoStateList``; None when there is no file or it is 1.30's classic form."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        log.info("no kubelet DRA checkpoint at %s: no DRA claims", path)
        return None
    except (OSError, ValueError) as exc:
        raise _unusable(path, f"cannot be read ({exc})") from exc
    if isinstance(doc, dict) and "version" in doc and "Data" not in doc:
        log.info("kubelet DRA checkpoint %s is classic DRA's (Kubernetes <= 1.30): no claims of a "
                 "structured-parameters driver", path)  # fmt: skip
        return None
    text = doc.get("Data") if isinstance(doc, dict) else None
    if not isinstance(text, str):
        raise _unusable(path, "has no Data text")
    if zlib.crc32(text.encode()) != doc.get("Checksum"):
        raise _unusable(path, f"fails its checksum ({doc.get('Checksum')!r})")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _unusable(path, f"holds Data that is not JSON ({exc})") from exc
    form = (data.get("kind"), data.get("apiVersion")) if isinstance(data, dict) else (None, None)
    claims = data.get("ClaimInfoStateList", []) if isinstance(data, dict) else None
    if form != (KIND, API_VERSION) or not isinstance(claims, list | None):
        raise _unusable(path, f"is kind {form[0]!r} apiVersion {form[1]!r}, not the {KIND} "
                        f"{API_VERSION} with a ClaimInfoStateList that kubelet 1.31-1.37 writes")  # fmt: skip
    return claims or []


def _unusable(path: str, problem: str) -> CniError:
    return CniError(
        STATE_CORRUPT,
        f"kubelet DRA checkpoint {path} {problem}, and kubelet's PodResources API could not tell "
        "them either, so the pod's DRA devices are unknown: make the PodResources socket reachable "
        "for rdma-multus (its podResourcesDir, <kubelet root>/pod-resources, mounted and kubelet "
        "running)",
    )
