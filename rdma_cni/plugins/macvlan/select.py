"""Which bonds an attachment gets: named by device IDs, or ``count`` free ones from ``masters``.

A device ID from a device plugin may be a netdev name (``bond3``), an RDMA device name
(``mlx5_bond_3``), a PCI address (``0000:3b:00.0`` — of the bond's lower NIC or of the RDMA
device) or a DRA claim's CDI device name (``<claim uid>-mlx5_bond_3``); anything else (the ``0``,
``1``… a shared device plugin hands out) is opaque and only says how many bonds to give. Runs
under the node lock, so "free" cannot change underneath.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rdma_cni.cni.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError
from rdma_cni.cni.request import Attachment, Request
from rdma_cni.node_policy import BONDS_FROM_KUBELET, NodePolicy
from rdma_cni.rdma import sysfs

if TYPE_CHECKING:
    from rdma_cni.kube.allocated import DeviceHolders
    from rdma_cni.plugins.macvlan.model import MacvlanConfig

log = logging.getLogger("rdma_cni.macvlan")


def requested_device_ids(req: Request) -> list[str]:
    """``runtimeConfig.deviceIDs`` / ``runtimeConfig.deviceID`` / top-level ``deviceID`` (Multus)."""
    rc = req.runtime_config
    for value in (rc.get("deviceIDs"), rc.get("deviceID"), req.config.get("deviceID")):
        if value is None or value == "" or value == []:
            continue
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) and v for v in items):
            raise CniError(INVALID_CONFIG, "deviceID(s) must be non-empty strings (netdev, RDMA dev or PCI)")
        return list(dict.fromkeys(items))
    return []


def aliases(sysfs_root: str, netdev: str, rdma_device: str | None) -> set[str]:
    """Every ID a device plugin might use for this bond."""
    names = {netdev}
    net = os.path.join(sysfs_root, "class", "net", netdev)
    candidates = [net]
    try:
        candidates += [os.path.join(net, e) for e in os.listdir(net) if e.startswith("lower_")]
    except OSError:
        pass
    if rdma_device:
        names.add(rdma_device)
        candidates.append(os.path.join(sysfs_root, "class", "infiniband", rdma_device))
    for path in candidates:
        pci = sysfs.bus_device(path)
        if pci:
            names.add(pci)
    return names


class PinnedElsewhere(CniError):
    """A bond the device IDs name (kubelet's allocation for this pod) is still pinned to another
    container: error 11, but one that usually clears in seconds (:func:`.plugin` waits for it)."""

    def __init__(self, msg: str) -> None:
        super().__init__(TRY_AGAIN_LATER, msg)


def is_opaque(dev_id: str) -> bool:
    """A shared device plugin's virtual ID (Mellanox's ``0``…``N-1``, our shared pool's): it says
    how many bonds, not which. Every other ID names a device, and must name one of this network's
    bonds."""
    return dev_id.isdigit()


# A claim's device as our DRA driver names it in its CDI spec (``<claim uid>-<RDMA device>``,
# :func:`rdma_cni.devices.cdi.device_ids`): what Multus v4.2.x passes as deviceID for a claim, the
# part of the CDI ID after "=" that it reads from PodResources' DynamicResources.
_CLAIM_DEVICE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-(.+)")


def claim_device(dev_id: str) -> str | None:
    """The RDMA device a claim's CDI device name carries, or None when ``dev_id`` is not one."""
    m = _CLAIM_DEVICE.fullmatch(dev_id)
    return m.group(1) if m else None


def choose_bonds(
    req: Request,
    masters: Sequence[str],
    count: int,
    pins: Mapping[str, Attachment],
    usable: Callable[[str], str],
    rdma_device_of: Callable[[str], str | None],
    sysfs_root: str,
    kubelet: DeviceHolders | None = None,
) -> list[str]:
    """Bonds for ``req.attachment``. ``usable(bond)`` returns "" or why the bond cannot be used now.

    Bonds named by device IDs are taken as named. The rest (opaque IDs, or ``count`` when no ID
    came) are chosen here, and ``kubelet`` (what it allocated on this node, when known) bounds the
    choice: never a bond kubelet gave another pod; with no ID at all, only the pod's own allocation
    (a meta plugin ran out of device IDs for it: upstream Multus passes none to references of a
    network beyond the pod's allocation), and nothing for a pod that holds none of a resource
    kubelet hands out here."""
    me = req.attachment
    ids = requested_device_ids(req)
    alias_map = {m: aliases(sysfs_root, m, rdma_device_of(m)) for m in masters} if ids or kubelet else {}
    wanted, opaque = _named_bonds(ids, alias_map) if ids else ([], count)
    again = _claim_ids_attached_here(ids, wanted, alias_map, pins, me)
    if again:
        if kubelet is None:
            raise CniError(INVALID_CONFIG, f"{again[0]} is already attached to this container "
                           f"({_who(pins[again[0]])}) and kubelet's allocation to the pod is unknown here: "
                           "no other bond of its claim can be chosen safely")
        wanted = [b for b in wanted if b not in again]
        opaque += len(again)
    _check_enough(masters, len(wanted) + opaque, "count" if not ids else "")
    if kubelet is not None and kubelet.only_allocated and wanted:
        _check_allocated(req, wanted, alias_map, kubelet)
    for bond in wanted:
        holder = pins.get(bond)
        if holder is not None and holder != me:
            raise PinnedElsewhere(f"{bond} is pinned to {_who(holder)}; {describe_pins(pins)}")
        why = usable(bond)
        if why:
            raise CniError(TRY_AGAIN_LATER, f"{bond} cannot be given out now: {why}")
    candidates: list[str] = list(masters)
    taken: dict[str, str] = {}
    if kubelet is not None and opaque:
        own_only = not ids or bool(again) or kubelet.only_allocated
        candidates, taken = _kubelet_bounds(req, masters, alias_map, kubelet, pins, opaque, not own_only)
    free: list[str] = []
    unusable: list[str] = []
    for m in candidates:  # each usable() asks the kernel: stop as soon as there are enough
        if len(free) == opaque:
            break
        if m in wanted or m in taken or pins.get(m) not in (None, me):
            continue
        why = usable(m)
        if why:
            unusable.append(f"{m}: {why}")
        else:
            free.append(m)
    if opaque > len(free):
        raise CniError(
            TRY_AGAIN_LATER,
            f"no free bond: need {opaque}, free {free or 'none'} of masters {list(masters)}; "
            + describe_pins(pins)
            + "".join(f"; {b} is allocated by kubelet to {who}" for b, who in sorted(taken.items()))
            + (f"; not usable now: {'; '.join(unusable)}" if unusable else ""),
        )
    return wanted + free


def _claim_ids_attached_here(ids: Sequence[str], wanted: Sequence[str], alias_map: Mapping[str, set[str]],
                             pins: Mapping[str, Attachment], me: Attachment) -> list[str]:
    """Bonds a claim's CDI device ID names that another attachment of this same container already
    holds. kubelet (v1.37.2, ``GetDynamicResources`` in container_manager_linux.go) reports in
    PodResources each device of a claim with the CDI IDs of every device before it as well, so
    Multus v4.2.x hands the n-th reference an ID of an earlier one: such a reference gets the next
    bond of the pod's own allocation instead (never another pod's), like a reference with no ID."""
    named = {m for m, names in alias_map.items() for i in ids if claim_device(i) in names}
    return [b for b in wanted if b in named and (h := pins.get(b)) is not None and h != me
            and h.container_id == me.container_id]


def _named_bonds(ids: Sequence[str], alias_map: Mapping[str, set[str]]) -> tuple[list[str], int]:
    """The bonds the IDs name, and how many IDs are opaque. An ID that names a device but no bond of
    this network is a config error (7): giving some other bond would steal it from its pod."""
    wanted: list[str] = []
    opaque = 0
    for dev_id in ids:
        match = [m for m, names in alias_map.items() if dev_id in names or claim_device(dev_id) in names]
        if match:
            wanted.append(match[0])
        elif is_opaque(dev_id):
            opaque += 1
        else:
            known = "; ".join(f"{m}: {', '.join(sorted(n - {m}))}" for m, n in alias_map.items())
            raise CniError(
                INVALID_CONFIG,
                f"device ID {dev_id!r} names no bond of this network on this node "
                f"(its bonds and their IDs: {known or 'none'}): the device plugin's resource and this "
                "network disagree; check the NetworkAttachmentDefinition's resourceName and 'masters'",
            )
    return list(dict.fromkeys(wanted)), opaque


def _kubelet_bounds(
    req: Request, masters: Sequence[str], alias_map: Mapping[str, set[str]], kubelet: DeviceHolders,
    pins: Mapping[str, Attachment], count: int, any_ids: bool,
) -> tuple[list[str], dict[str, str]]:
    """The bonds the choice may take, and the bonds kubelet gave other pods (never to be taken)."""
    bond_of = {name: m for m, names in alias_map.items() for name in names}
    taken = {bond_of[d]: who for d, who in kubelet.others.items() if d in bond_of}
    if any_ids:  # opaque IDs of another resource: any bond but another pod's
        return list(masters), taken
    who = _pod(req)
    mine = list(dict.fromkeys(bond_of[d] for d in kubelet.mine if d in bond_of))
    if mine:
        left = [b for b in mine if pins.get(b) in (None, req.attachment)]
        if len(left) < count:
            held = ", ".join(f"{b} by {_who(pins[b])}" for b in mine if b not in left)
            raise CniError(
                INVALID_CONFIG,
                f"{who} was allocated {len(mine)} {kubelet.resource} device(s) ({', '.join(mine)}) and "
                f"{held} already attached; attachment {req.ifname} would need {count} more: reference "
                f"the network at most as many times as the pod asks for {kubelet.resource}, or ask for "
                f"more (read from {kubelet.source})",
            )
        return left, taken
    if kubelet.served or kubelet.only_allocated:
        raise CniError(
            INVALID_CONFIG,
            f"{who} holds no {kubelet.resource} device, and kubelet hands them out on this node: a bond "
            f"taken without one could be another pod's; request {kubelet.resource} in the pod's spec "
            f"(read from {kubelet.source})",
        )
    return list(masters), taken


def _check_allocated(req: Request, wanted: Sequence[str], alias_map: Mapping[str, set[str]],
                     kubelet: DeviceHolders) -> None:
    """Every bond a device ID names (from a meta plugin, an annotation, a NAD, runtimeConfig or
    CNI_ARGS) must be one kubelet allocated to this pod: the ID alone proves nothing."""
    bond_of = {name: m for m, names in alias_map.items() for name in names}
    mine = {bond_of[d] for d in kubelet.mine if d in bond_of}
    mine |= {bond_of[c] for d in kubelet.mine if (c := claim_device(d) or "") in bond_of}
    for bond in wanted:
        if bond in mine:
            continue
        holder = next((who for d, who in kubelet.others.items() if bond_of.get(d) == bond), "no pod")
        raise CniError(
            INVALID_CONFIG,
            f"the device ID for {bond} names a bond kubelet allocated to {holder}, not to {_pod(req)} "
            f"(its {kubelet.resource} allocation: {', '.join(sorted(mine)) or 'none'}; read from "
            f"{kubelet.source}): a pod gets only the bonds kubelet allocated to it; remove the deviceID "
            "from the annotation or network config",
        )


def _pod(req: Request) -> str:
    ns, name = req.args.get("K8S_POD_NAMESPACE", ""), req.args.get("K8S_POD_NAME", "")
    return f"pod {ns}/{name}" if name else f"container {req.container_id}"


def kubelet_view(req: Request, cfg: MacvlanConfig, policy: NodePolicy) -> DeviceHolders | None:
    """What kubelet allocated on this node, for a Kubernetes pod: the pick must respect it
    (:func:`.select.choose_bonds`). Where the node's policy says bonds come from kubelet, asked for
    every such pod, and a pod whose allocation cannot be read gets no bond (error 11 saying why);
    else asked only when this ADD may pick bonds itself (no device ID names them, or a DRA claim's
    ID that kubelet may have reported twice)."""
    ids = requested_device_ids(req)
    name = req.args.get("K8S_POD_NAME", "")
    strict = policy.enforced and policy.bonds_from == BONDS_FROM_KUBELET
    if not name or (not strict and ids and not any(is_opaque(i) or claim_device(i) for i in ids)):
        return None
    from rdma_cni.devices.dra_names import DRIVER
    from rdma_cni.kube import allocated  # gRPC: only for an ADD that asks kubelet

    pod = allocated.PodRef(req.args.get("K8S_POD_NAMESPACE", ""), name, req.args.get("K8S_POD_UID", ""))
    got = allocated.pod_view(pod, cfg.resource_name, DRIVER, cfg.pod_resources(), cfg.device_plugin_dir)
    if got is None and strict:
        raise CniError(
            TRY_AGAIN_LATER,
            f"pod {pod.namespace}/{pod.name}: kubelet's device allocation cannot be read (no PodResources "
            f"socket in {cfg.pod_resources()}, no checkpoint in {cfg.device_plugin_dir}), and on this node "
            f"bonds go only to the pods kubelet allocated them to ({policy.where()}, bondsFrom: kubelet)",
        )
    if got is None:
        log.info("ADD %s/%s: no kubelet device allocation to respect (no PodResources, no checkpoint)",
                 req.container_id, req.ifname)
    elif strict:
        got = dataclasses.replace(got, only_allocated=True)
    return got


def _check_enough(masters: Sequence[str], need: int, key: str) -> None:
    """Asking for more bonds than the network has can never succeed: a config error (7), not "no
    free bond, try again" (11)."""
    if need <= len(masters):
        return
    asked = f"config key 'count' is {need}" if key else f"the pod asks for {need} bonds (its device IDs)"
    raise CniError(
        INVALID_CONFIG,
        f"{asked}, but 'masters' has only {len(masters)} ({list(masters)}): lower it or list more bonds",
    )


def _who(att: Attachment) -> str:
    return f"container {att.container_id} ({att.ifname})"


def describe_pins(pins: Mapping[str, Any]) -> str:
    if not pins:
        return "nothing is pinned"
    return "in use: " + ", ".join(f"{b} by {_who(a)}" for b, a in sorted(pins.items()))
