"""Which devices of a ResourceClaim this driver must prepare on this node: a pure reading of the
claim object (``resource.k8s.io/v1``, field names as in ``k8s.io/api@v0.37.2/resource/v1/types.go``:
``status.allocation.devices.results[]`` of ``{request, driver, pool, device, shareID}``).

The scheduler may put devices of several drivers (GPUs and NICs aligned by pcieRoot) into one
claim; only ours of our pool (named after the node) are ours to prepare.

    ours = allocated(claim_obj, "rdma.tke.cloud.tencent.com", "node-a")   # [Allocated("nic", "bond0", None)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Allocated:
    request: str
    device: str
    share_id: str | None = None  # set for a share of a multi-allocatable device (shared mode)


class ClaimShapeError(ValueError):
    """The claim is not allocated, or its allocation is not what the API defines."""


def allocated(claim: dict[str, Any], driver: str, pool: str) -> list[Allocated]:
    """The results of ``claim``'s allocation that are ``driver``'s in ``pool``, in the claim's order."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        raise ClaimShapeError("the claim is not allocated (status.allocation is empty)")
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, list):
        raise ClaimShapeError("status.allocation.devices.results is not a list")
    out: list[Allocated] = []
    for r in results:
        if not isinstance(r, dict) or r.get("driver") != driver or r.get("pool") != pool:
            continue
        request, device, share = r.get("request"), r.get("device"), r.get("shareID")
        if not isinstance(request, str) or not isinstance(device, str):
            raise ClaimShapeError(f"an allocation result has no request or device name: {r!r}")
        out.append(Allocated(request, device, share if isinstance(share, str) else None))
    return out


def uid_of(claim: dict[str, Any]) -> str:
    uid = (claim.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) else ""
