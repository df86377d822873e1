"""The kernel RDMA subsystem's netns mode: ``shared`` (every netns sees every device) or ``exclusive``.

Sources, in order: ``<sysfs_root>/module/ib_core/parameters/netns_mode`` (seen on the real kernel to
read ``Y`` in shared and ``N`` in exclusive mode and to follow ``rdma system set netns``), then RDMA
netlink (``RDMA_NLDEV_CMD_SYS_GET``), then the ``rdma`` tool. The last two ask the running kernel, so
they are only used when ``sysfs_root`` is that kernel's ``/sys`` (a captured or simulated tree must
not be answered by the machine the test runs on).

Usage::

    require_mode("/sys", "shared")     # CniError(101) with the fix when the node is exclusive
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from rdma_cni.cni.errors import NO_RDMA_DEVICE, RDMA_MODE_MISMATCH, CniError
from rdma_cni.rdma import nldev, sysfs

SHARED = nldev.SHARED
EXCLUSIVE = nldev.EXCLUSIVE
MODES = (SHARED, EXCLUSIVE)
PARAM = os.path.join("module", "ib_core", "parameters", "netns_mode")

FIX_SHARED = (
    "run `rdma system set netns shared` on the node while no network namespace other than the host's "
    "exists (the kernel answers 'Device or resource busy' otherwise, e.g. at boot before pods start); "
    "make it permanent with `options ib_core netns_mode=1` in /etc/modprobe.d/"
)
FIX_EXCLUSIVE = (
    "run `rdma system set netns exclusive` on the node while no network namespace other than the host's "
    "exists; make it permanent with `options ib_core netns_mode=0` in /etc/modprobe.d/"
)


def mode_from_param(text: str) -> str | None:
    """``Y``/``1`` -> shared, ``N``/``0`` -> exclusive (a bool module parameter)."""
    value = text.strip().upper()
    if value in ("Y", "1"):
        return SHARED
    if value in ("N", "0"):
        return EXCLUSIVE
    return None


def _from_sysfs(sysfs_root: str) -> tuple[str | None, str]:
    path = os.path.join(sysfs_root, PARAM)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        return None, f"{path}: {e.strerror}"
    mode = mode_from_param(text)
    return mode, "" if mode else f"{path}: unexpected value {text.strip()!r}"


def _is_live_sysfs(sysfs_root: str) -> bool:
    return os.path.realpath(sysfs_root) == "/sys"


def current_netns_mode(sysfs_root: str, ask_kernel: bool | None = None) -> str:
    """``shared`` or ``exclusive``; CniError(101) naming every source tried when none can tell.

    ``ask_kernel`` (default: only when ``sysfs_root`` is ``/sys``) allows the netlink and tool fallbacks.
    """
    mode, why = _from_sysfs(sysfs_root)
    if mode:
        return mode
    tried = [why]
    if ask_kernel if ask_kernel is not None else _is_live_sysfs(sysfs_root):
        try:
            return nldev.system_netns_mode().netns_mode
        except OSError as e:
            tried.append(f"RDMA netlink and the rdma tool: {e.strerror or e}")
    raise CniError(
        RDMA_MODE_MISMATCH,
        "cannot tell the kernel RDMA netns mode: is the RDMA core (ib_core) loaded on this node?",
        "; ".join(tried),
    )


def require_mode(sysfs_root: str, wanted: str, ask_kernel: bool | None = None) -> str:
    """Return the mode when it is ``wanted``; else CniError(101) that says how to fix the node."""
    if wanted not in MODES:
        raise ValueError(f"netns mode must be one of {MODES}, not {wanted!r}")
    mode = current_netns_mode(sysfs_root, ask_kernel)
    if mode != wanted:
        raise CniError(
            RDMA_MODE_MISMATCH,
            f"kernel RDMA netns mode is {mode} but rdma.netnsMode is {wanted}",
            f"fix: {FIX_SHARED if wanted == SHARED else FIX_EXCLUSIVE}; "
            f"or set rdma.netnsMode to {mode} in the network config",
        )
    return mode


def bond_ports(
    sysfs_root: str, bonds: Iterable[str], ports: list[sysfs.RdmaPort], required: bool, netns_mode: str
) -> dict[str, sysfs.RdmaPort]:
    """The RDMA port behind each bond that has one (``ports``: :func:`sysfs.list_ports` as the
    caller just read it), the kernel's RDMA netns mode required once a bond has one. A bond without
    an RDMA device is CNI error NO_RDMA_DEVICE naming it when ``required``, else left out: both
    plugins then move it without RDMA (a TCP-only network)."""
    found: dict[str, sysfs.RdmaPort] = {}
    for bond in bonds:
        port = sysfs.port_for_netdev(sysfs_root, bond, ports)
        if port is None:
            if required:
                raise CniError(
                    NO_RDMA_DEVICE,
                    f"{bond} has no RDMA device under {sysfs_root}/class/infiniband",
                    "attach one (e.g. `rdma link add` for Soft-RoCE), remove the bond from 'masters', "
                    "or set rdma.required to false for a TCP-only network",
                )
            continue
        if not found:
            require_mode(sysfs_root, netns_mode)
        found[bond] = port
    return found
