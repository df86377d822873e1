"""The bonds a pod's DRA claims hold, as the device IDs rdma-macvlan and rdma-ipvlan already read.

Under DRA, kubelet asks ``rdma-dra-driver`` to prepare the pod's claims before the sandbox exists;
the CNI ADD runs after, and learns the claims' devices from kubelet (PodResources, else its DRA
checkpoint: :class:`~rdma_cni.plugins.multus.pod.PodView`) by DRA device name only (``bond1``).
Only devices of our driver (:data:`~rdma_cni.devices.dra_names.DRIVER`) are bonds; a GPU of
another driver in the same claim is none of the network's business.

Each name is turned back into the bond the driver named, through the device model's naming
(:func:`~rdma_cni.devices.dra_names.node_bonds`) over the bonds of the network's own plugin config
(its ``masters`` and ``sysfsRoot``: the bonds it can move), and handed down as that bond's RDMA
device name (``mlx5_bond_1``) — exactly the ID a device plugin gives, so rdma-macvlan moves the
bond's IP in with the host's GID index and DEL gives it back by the same path. A shared-mode claim
(``allocationMode: All`` over multi-allocatable devices) names every bond; rdma-ipvlan gives the
pod an address on each, as for a device-plugin shared pod, and only needs them all to be known.

A name that matches no bond is refused before any delegate runs (nothing on the node changes):
handing it down would make rdma-macvlan count it as an opaque ID and give the pod some other bond.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rdma_cni.cni.errors import INVALID_CONFIG, CniError
from rdma_cni.devices import dra_names

if TYPE_CHECKING:
    from rdma_cni.kube.podresources import ClaimDevice

log = logging.getLogger("rdma_cni.multus")


def claimed_bonds(claims: Sequence[ClaimDevice], who: str, network: str, plugin: Mapping[str, Any]) -> (
    list[str]
):  # fmt: skip
    """The RDMA device names of the bonds ``claims`` (our driver's devices of pod ``who``) hold,
    each once, in the claims' order; ``plugin`` is the config of the network's plugin that takes
    them. Raises CniError (INVALID_CONFIG) naming every device that matches no bond, and the fix."""
    sysfs_root, masters = _bond_source(plugin)
    bonds = dra_names.node_bonds(sysfs_root, masters)
    unknown = [c for c in claims if c.device not in bonds]
    if unknown:
        raise CniError(INVALID_CONFIG, _unknown(unknown, who, network, bonds, masters, sysfs_root))
    ids = list(dict.fromkeys(bonds[c.device].device for c in claims))
    log.info("%s: DRA devices %s of %s are bonds %s", who, [c.device for c in claims], dra_names.DRIVER,
             {c.device: bonds[c.device].netdev for c in claims})  # fmt: skip
    return ids


def _bond_source(plugin: Mapping[str, Any]) -> tuple[str, list[str] | None]:
    """Where the network's plugin finds its bonds: ``sysfsRoot`` (default /sys) and ``masters``
    (absent: every RoCE bond). A malformed key is the plugin's own error 7 when it runs; here it
    means the default."""
    root, masters = plugin.get("sysfsRoot"), plugin.get("masters")
    if not (isinstance(masters, list) and all(isinstance(m, str) for m in masters)):
        masters = None
    return (root if isinstance(root, str) and root else "/sys"), masters


def _unknown(
    unknown: Sequence[ClaimDevice],
    who: str,
    network: str,
    bonds: Mapping[str, Any],
    masters: list[str] | None,
    sysfs_root: str,
) -> str:
    held = ", ".join(f"{c.device!r} (claim {c.claim_namespace}/{c.claim_name})" for c in unknown)
    known = ", ".join(f"{name} = {b.netdev}" for name, b in bonds.items()) or "none"
    where = f"its masters {masters}" if masters is not None else f"every RoCE bond under {sysfs_root}"
    return (
        f"pod {who} holds DRA device(s) {held} of driver {unknown[0].driver}, which match no bond "
        f"network {network} can give ({where}: {known}): the driver and the network must see the same "
        "bonds — add the bond to the network's 'masters' (or check its 'sysfsRoot'), or, if the bond "
        "has gone, bring it back (the driver keeps it tainted on its ResourceSlice: kubectl get "
        "resourceslices) and recreate the pod"
    )
