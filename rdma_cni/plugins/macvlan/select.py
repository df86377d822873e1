"""Which bonds an attachment gets: named by device IDs, or ``count`` free ones from ``masters``.

A device ID from a device plugin may be a netdev name (``bond3``), an RDMA device name
(``mlx5_bond_3``) or a PCI address (``0000:3b:00.0`` — of the bond's lower NIC or of the RDMA
device); anything else (the ``0``, ``1``… a shared device plugin hands out) is opaque and only says
how many bonds to give. Runs under the node lock, so "free" cannot change underneath.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rdma_cni.cni.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError
from rdma_cni.cni.request import Attachment, Request
from rdma_cni.rdma import sysfs


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


def choose_bonds(
    req: Request,
    masters: Sequence[str],
    count: int,
    pins: Mapping[str, Attachment],
    usable: Callable[[str], str],
    rdma_device_of: Callable[[str], str | None],
    sysfs_root: str,
) -> list[str]:
    """Bonds for ``req.attachment``. ``usable(bond)`` returns "" or why the bond cannot be used now."""
    me = req.attachment
    ids = requested_device_ids(req)
    wanted: list[str] = []
    opaque = 0
    if ids:
        alias_map = {m: aliases(sysfs_root, m, rdma_device_of(m)) for m in masters}
        for dev_id in ids:
            match = [m for m, names in alias_map.items() if dev_id in names]
            if match:
                wanted.append(match[0])
            else:
                opaque += 1
        wanted = list(dict.fromkeys(wanted))
    else:
        opaque = count
    _check_enough(masters, len(wanted) + opaque, "count" if not ids else "")
    for bond in wanted:
        holder = pins.get(bond)
        if holder is not None and holder != me:
            raise CniError(TRY_AGAIN_LATER, f"{bond} is pinned to {_who(holder)}; {describe_pins(pins)}")
        why = usable(bond)
        if why:
            raise CniError(TRY_AGAIN_LATER, f"{bond} cannot be given out now: {why}")
    free: list[str] = []
    unusable: list[str] = []
    for m in masters:  # each usable() asks the kernel: stop as soon as there are enough
        if len(free) == opaque:
            break
        if m in wanted or pins.get(m) not in (None, me):
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
            + describe_pins(pins) + (f"; not usable now: {'; '.join(unusable)}" if unusable else ""),
        )
    return wanted + free


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
