"""Which devices of a ResourceClaim this driver must prepare on this node: a pure reading of the
claim object (``resource.k8s.io/v1``, field names as in ``k8s.io/api@v0.37.2/resource/v1/types.go``:
``status.allocation.devices.results[]`` of ``{request, driver, pool, device, shareID}``).

The scheduler may put devices of several drivers (GPUs and NICs aligned by pcieRoot) into one
claim; only ours of our pool (named after the node) are ours to prepare.

    ours = allocated(claim_obj, "rdma.tke.cloud.tencent.com", "node-a")   # [Allocated("nic", "bond0", None)]

A claim's opaque config for this driver (``status.allocation.devices.config[]``) is written by the
pod's author (``FromClaim``) or the DeviceClass's (``FromClass``, the cluster admin): user input the
driver decodes strictly (:func:`driver_config`), class configs first. The driver takes no parameters
yet: a config object of its ``apiVersion`` and ``kind`` is accepted and changes nothing, any other
field is refused by name, so nothing a claim sets can widen what the node decided.
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
    allocation = _object(claim, "status").get("allocation")
    if not isinstance(allocation, dict):
        raise ClaimShapeError("the claim is not allocated (status.allocation is empty)")
    results = _object(allocation, "devices", "status.allocation.").get("results") or []
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
    meta = claim.get("metadata")
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return uid if isinstance(uid, str) else ""


def _object(parent: dict[str, Any], key: str, where: str = "") -> dict[str, Any]:
    """``parent[key]`` when it is an object, {} when absent or empty; ClaimShapeError otherwise (the
    API server never sends that, so whatever sent it is not a ResourceClaim as the API defines it)."""
    value = parent.get(key) or {}
    if not isinstance(value, dict):
        raise ClaimShapeError(f"{where}{key} is not an object")
    return value


CONFIG_API_VERSION = "rdma.tke.cloud.tencent.com/v1alpha1"
CONFIG_KIND = "RdmaConfig"
SOURCES = ("FromClass", "FromClaim")  # the order they apply in: the admin's, then the user's


@dataclass(frozen=True)
class DriverConfig:
    source: str  # FromClass or FromClaim
    requests: tuple[str, ...]  # empty: every request of the claim
    parameters: dict[str, Any]


def driver_config(claim: dict[str, Any], driver: str) -> list[DriverConfig]:
    """The opaque configs of ``claim``'s allocation for ``driver``, class configs before claim configs,
    each decoded strictly; ClaimShapeError naming the entry and the field otherwise."""
    allocation = _object(_object(claim, "status"), "allocation", "status.")
    entries = _object(allocation, "devices", "status.allocation.").get("config") or []
    if not isinstance(entries, list):
        raise ClaimShapeError("status.allocation.devices.config is not a list")
    out: list[DriverConfig] = []
    for i, entry in enumerate(entries):
        where = f"status.allocation.devices.config[{i}]"
        if not isinstance(entry, dict):
            raise ClaimShapeError(f"{where} is not an object")
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue
        source = entry.get("source")
        if source not in SOURCES:
            raise ClaimShapeError(f"{where}.source is {source!r}, not one of {', '.join(SOURCES)}")
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ClaimShapeError(f"{where}.requests is not a list of request names")
        params = _parameters(opaque.get("parameters"), where, source)
        out.append(DriverConfig(source, tuple(requests), params))
    return sorted(out, key=lambda c: SOURCES.index(c.source))


def _parameters(value: Any, where: str, source: str) -> dict[str, Any]:
    who = "the DeviceClass" if source == "FromClass" else "the ResourceClaim"
    if not isinstance(value, dict):
        raise ClaimShapeError(f"{where}.opaque.parameters (from {who}) is not an object")
    if value.get("apiVersion") != CONFIG_API_VERSION or value.get("kind") != CONFIG_KIND:
        raise ClaimShapeError(
            f"{where}.opaque.parameters (from {who}) is apiVersion {value.get('apiVersion')!r} kind "
            f"{value.get('kind')!r}: this driver reads apiVersion {CONFIG_API_VERSION} kind {CONFIG_KIND}"
        )
    unknown = sorted(k for k in value if k not in ("apiVersion", "kind"))
    if unknown:
        raise ClaimShapeError(
            f"{where}.opaque.parameters (from {who}) has unknown field(s) {', '.join(unknown)}: "
            f"{CONFIG_KIND} has none yet; the node's policy decides the devices, paths and environment"
        )
    return dict(value)
