"""``cni-tool held-claims``' judgement: which claims of our DRA driver pods still hold (the chart's
pre-delete hook refuses an uninstall on them). Through the real API server: test_cluster_e2e's DRA
uninstall."""

from __future__ import annotations

from typing import Any

from rdma_cni.cli.tool_held_claims import held
from rdma_cni.devices.dra_names import DRIVER


def claim(
    name: str, driver: str = DRIVER, pods: tuple[str, ...] = (), allocated: bool = True
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": [{"driver": driver, "pool": "n1", "device": "bond0"}]}}
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"u-{p}"} for p in pods]
    return {"metadata": {"namespace": "default", "name": name}, "status": status}


def test_a_claim_of_ours_reserved_for_a_pod_is_held_and_names_the_pod() -> None:
    claims = [
        claim("ibv-app-0-rdma", pods=("ibv-app-0",)),
        claim("free"),
        claim("gpu", "gpu.nvidia.com", ("p",)),
    ]
    assert held(claims, DRIVER) == {"default/ibv-app-0-rdma": ["ibv-app-0"]}


def test_unallocated_unreserved_and_empty_claims_hold_nothing() -> None:
    claims = [
        claim("pending", pods=("p",), allocated=False),
        claim("done"),
        {"metadata": {}},
        {"status": None},
    ]
    assert held(claims, DRIVER) == {}
