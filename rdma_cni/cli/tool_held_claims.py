"""``cni-tool held-claims``: the ResourceClaims of our DRA driver that pods still hold.

kubelet unprepares a claim through the driver that prepared it, before the pod holding it can finish
terminating. Remove the driver (``helm uninstall`` of the DRA variant) while a pod holds one of its
claims, and that pod stays Terminating for ever (seen: 4 pods still "Running" in the API 90 s after
they were deleted). The chart's pre-delete hook runs this and refuses the uninstall while any claim
is held, naming the pods:

    cni-tool held-claims                      # exit 1 and the holders, or exit 0
    cni-tool held-claims --kubeconfig FILE    # outside a pod
"""

from __future__ import annotations

import os
from typing import Any

import click

from rdma_cni.cni.errors import CniError
from rdma_cni.devices.dra_names import DRIVER
from rdma_cni.dra.kubeapi import in_cluster
from rdma_cni.kube import kubeconfig
from rdma_cni.kube.client import PodClient

CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
LIST_RBAC = "grant this identity 'list' on resourceclaims (resource.k8s.io)"


def held(claims: list[dict[str, Any]], driver: str) -> dict[str, list[str]]:
    """namespace/claim -> the pods it is reserved for, of every claim allocated a device of
    ``driver`` that some pod still holds (status.reservedFor: kubelet prepared it, or will)."""
    out: dict[str, list[str]] = {}
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if not any(r.get("driver") == driver for r in results):
            continue
        pods = [r.get("name", "?") for r in status.get("reservedFor") or [] if r.get("resource") == "pods"]
        if pods:
            meta = claim.get("metadata") or {}
            out[f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"] = pods
    return out


class ClaimReader(PodClient):
    """:class:`PodClient`'s transport with the one list this verb makes."""

    def claims(self) -> list[dict[str, Any]]:
        obj = self._get_object(CLAIMS, "ResourceClaims", LIST_RBAC)
        items = obj.get("items") if obj is not None else None
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


@click.command("held-claims")
@click.option("--driver", default=DRIVER, show_default=True, help="the DRA driver whose claims count")
@click.option("--kubeconfig", "kubeconfig_path", default="", help="else the pod's ServiceAccount")
@click.pass_context
def held_claims(ctx: click.Context, /, driver: str, kubeconfig_path: str) -> None:
    """Exit 1 naming the pods that hold claims of DRIVER (delete them before removing the driver)."""
    try:
        config = kubeconfig.load(kubeconfig_path) if kubeconfig_path else in_cluster(dict(os.environ))
        found = held(ClaimReader(config).claims(), driver)
    except CniError as err:
        raise click.ClickException(err.msg) from err
    if not found:
        click.echo(f"no pod holds a claim of {driver}: it may be removed")
        return
    holders = "; ".join(f"{claim} by pod {', '.join(pods)}" for claim, pods in sorted(found.items()))
    click.echo(
        f"{len(found)} claim(s) of {driver} still held ({holders}): kubelet unprepares them through "
        f"this driver, so removing it now would leave those pods unable to terminate. Delete those "
        f"pods first (their bonds come back to the node), then uninstall again.",
        err=True,
    )
    ctx.exit(1)
