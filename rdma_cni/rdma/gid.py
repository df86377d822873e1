"""Waiting for the kernel to publish a pod's RoCE v2 GID, and checking its index.

On the real kernel (lab FINDINGS, Q2) the GID appears before the ``ip addr add`` netlink call returns,
so the wait is normally over at the first read; it exists for drivers that program the GID into the
hardware asynchronously and for slow readers. The poll starts at 2 ms and backs off to 50 ms, and the
whole wait is bounded by ``timeout_ms`` (``rdma.gidTimeoutMs``).

Usage::

    entry = wait_for_gid("/sys", "mlx5_bond_0", 1, "198.51.100.2", 2000, ndev="bond0")
    check_gid_index(entry, host_index)       # CniError(102) when the index moved
"""

from __future__ import annotations

import time

from rdma_cni.cni.errors import GID_MISMATCH, GID_TIMEOUT, CniError
from rdma_cni.rdma import sysfs
from rdma_cni.rdma.sysfs import GidEntry

FIRST_POLL_S = 0.002
MAX_POLL_S = 0.05


def describe_table(sysfs_root: str, device: str, port: int) -> str:
    """The port's table on one line, for error details ("0 fe80::1 RoCE v2 bond0; 1 ...")."""
    entries = sysfs.read_gids(sysfs_root, device, port)
    if not entries:
        return f"{device} port {port}: GID table empty"
    return f"{device} port {port}: " + "; ".join(
        f"{e.index} {e.gid} {e.type} {e.ndev or '-'}" for e in entries
    )


def wait_for_gid(
    sysfs_root: str,
    device: str,
    port: int,
    ip: str,
    timeout_ms: int,
    ndev: str | None = None,
    gid_type: str = sysfs.ROCE_V2,
) -> GidEntry:
    """The entry of ``ip``'s GID once the kernel has published it; CniError(103) after ``timeout_ms``."""
    deadline = time.monotonic() + max(timeout_ms, 0) / 1000
    delay = FIRST_POLL_S
    while True:
        entry = sysfs.find_gid(sysfs_root, device, port, ip, gid_type, ndev)
        if entry is not None:
            return entry
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(delay, left))
        delay = min(delay * 2, MAX_POLL_S)
    on = f" on {ndev}" if ndev else ""
    raise CniError(
        GID_TIMEOUT,
        f"RDMA device {device} port {port} did not publish the {gid_type} GID of {ip}{on} "
        f"within {timeout_ms} ms",
        describe_table(sysfs_root, device, port)
        + "; raise rdma.gidTimeoutMs if the driver is slow, or check the address is on the pod interface",
    )


def wait_for_gid_gone(sysfs_root: str, device: str, port: int, ip: str, timeout_ms: int) -> bool:
    """Wait (bounded) until no GID of ``ip`` is left in the table; False if one still is.

    DEL after a pod netns was deleted: the kernel tears the netns down asynchronously (tens of ms
    in the lab) and the pod's GID holds its slot until then. Giving the IP back to the bond before
    that lands the host's GID at the next free index, so DEL waits for the slot first.
    """
    deadline = time.monotonic() + max(timeout_ms, 0) / 1000
    delay = FIRST_POLL_S
    while sysfs.find_gid(sysfs_root, device, port, ip) is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, MAX_POLL_S)
    return True


def check_gid_index(
    entry: GidEntry, expected: int, source: str = "host", sysfs_root: str | None = None
) -> None:
    """Fail with CniError(102) when ``entry`` is not at ``expected`` (the host's or a configured index).

    The usual causes (lab FINDINGS, ordering variants): the pod address was added before the host's
    was removed, the pod link came up first and its IPv6 link-local took the slot, or another address
    took the slot while the IP was away.
    """
    if entry.index == expected:
        return
    table = describe_table(sysfs_root, entry.device, entry.port) if sysfs_root else ""
    raise CniError(
        GID_MISMATCH,
        f"RoCE v2 GID of {entry.ipv4 or entry.gid} on {entry.device} port {entry.port} is at index "
        f"{entry.index}, the {source} index is {expected}",
        "another GID took the slot while the address moved (address added to the pod before it left the "
        "host, or the pod link up before the address, or a second pod on this bond)"
        + (f"; {table}" if table else ""),
    )
