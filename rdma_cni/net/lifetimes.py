"""Finite address lifetimes as deadlines on the kernel's own address clock, so that moving an address
any number of times (into a pod, back onto the bond) never costs it more than half a second.

What the kernel keeps per address (``net/ipv6/addrconf.c``, ``net/ipv4/devinet.c``): ``tstamp``, the
jiffies of its last update, and the valid/preferred lifetimes it was given then, in whole seconds; it
deletes (deprecates) it once ``(jiffies - tstamp) / HZ`` — the age in whole seconds, rounded down —
reaches them. A dump's ``IFA_CACHEINFO`` gives ``tstamp`` in hundredths of a second since boot and the
lifetimes *less that age*. So the deadline is ``tstamp + 100 * (shown + age)`` hundredths, exact once
the age is known, which needs the kernel clock's "now". Adding an address can only give whole
seconds counted from the add, so each add lands within half a second of the deadline asked for
(rounded to the nearest second): a move must therefore always aim at the first deadline, never at
the one the previous move left (the half seconds would add up). The write-ahead record carries it
through one ADD/DEL; a give-back leaves a note (:func:`rdma_cni.state.NodeState.note_deadlines`) of
the address as the kernel stamped it, so the next ADD finds the first deadline again.

The clock: the kernel's hundredths since boot run with CLOCK_MONOTONIC at an offset fixed per boot
(a fraction of a second) that no file tells; it is measured once per process, when first needed, by
adding an address to ``lo`` in a private network namespace and reading the ``tstamp`` it got (~2 ms).
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from rdma_cni.net import rtnl
from rdma_cni.net.netns import CLONE_NEWNET, libc
from rdma_cni.net.nlsock import RtnlSocket

log = logging.getLogger("rdma_cni.lifetimes")

FOREVER = 0xFFFFFFFF
PER_SECOND = 100  # IFA_CACHEINFO's stamps are hundredths of a second
SLACK = 2.0  # hundredths: tstamp's truncation to a hundredth plus the measured offset's error
_LO = 1
_PROBE_IP = "192.0.2.1"  # TEST-NET-1, on lo of a namespace nothing else sees

_offset: list[float] = []
_boot: list[str] = []


def boot_id() -> str:
    """This boot's identity: a deadline of another boot's clock means nothing now."""
    if not _boot:
        with open("/proc/sys/kernel/random/boot_id") as f:
            _boot.append(f.read().strip())
    return _boot[0]


def _probe_offset() -> float:
    """CLOCK_MONOTONIC minus the kernel's address clock, in hundredths, measured in a thread of its
    own (a netns unshared by a thread is that thread's alone, gone when it ends)."""
    found: list[float] = []
    failed: list[BaseException] = []

    def probe() -> None:
        try:
            if libc().unshare(CLONE_NEWNET) != 0:
                raise OSError("unshare(CLONE_NEWNET) refused")
            with RtnlSocket() as ipr:
                before = time.monotonic()
                rtnl.create(
                    ipr,
                    "addr",
                    {
                        "family": socket.AF_INET,
                        "prefixlen": 32,
                        "flags": 0,
                        "scope": 0,
                        "index": _LO,
                        "attrs": [
                            ["IFA_LOCAL", _PROBE_IP],
                            ["IFA_ADDRESS", _PROBE_IP],
                            [
                                "IFA_CACHEINFO",
                                {"ifa_preferred": 60, "ifa_valid": 60, "cstamp": 0, "tstamp": 0},
                            ],
                        ],
                    },
                )
                after = time.monotonic()
                stamp = next(
                    int(rtnl.attr(m, "IFA_CACHEINFO")["tstamp"])
                    for m in ipr.addr_dump(index=_LO)
                    if rtnl.attr(m, "IFA_LOCAL") == _PROBE_IP
                )
            found.append((before + after) / 2 * PER_SECOND - (stamp + 0.5))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            failed.append(exc)

    worker = threading.Thread(target=probe, name="kernel-clock-probe")
    worker.start()
    worker.join()
    if not found:
        log.warning(
            "cannot measure the kernel's address clock (%s): deadlines may be off by its offset "
            "from CLOCK_MONOTONIC (a fraction of a second)",
            failed[0] if failed else "no answer",
        )
        return 0.0
    return found[0]


def kernel_now(monotonic: float | None = None) -> float:
    """The kernel's address clock (hundredths since boot) at ``monotonic`` (default: now)."""
    if not _offset:
        _offset.append(_probe_offset())
    return (time.monotonic() if monotonic is None else monotonic) * PER_SECOND - _offset[0]


@dataclass(frozen=True)
class Deadlines:
    """When an address stops being valid / preferred, in the kernel's hundredths since boot.
    ``exact``: False when the dump fell within :data:`SLACK` of a whole second of the address's age
    (the age the kernel took off might be one more): then ``valid``/``preferred`` are the earlier."""

    valid: int
    preferred: int
    exact: bool = True


def finite(info: dict[str, Any] | None) -> bool:
    return info is not None and int(info["ifa_valid"]) != FOREVER


def from_cacheinfo(info: dict[str, Any], dumped: tuple[float, float]) -> Deadlines:
    """The deadlines of a finite lifetime from its ``IFA_CACHEINFO``; ``dumped``: CLOCK_MONOTONIC
    just before and just after the dump that reported it."""
    stamp = int(info["tstamp"])
    lo = math.floor((kernel_now(dumped[0]) - SLACK - stamp) / PER_SECOND)
    hi = math.floor((kernel_now(dumped[1]) + SLACK - stamp) / PER_SECOND)
    age = max(0, lo)
    valid, preferred = int(info["ifa_valid"]), int(info["ifa_preferred"])
    until = stamp + PER_SECOND * (valid + age)
    # A shown 0 means "age or less": deprecated (expired) already, so no later than now.
    return Deadlines(
        valid=until,
        preferred=min(until, stamp + PER_SECOND * (min(preferred, valid) + age)),
        exact=max(0, hi) == age,
    )


def seconds_left(until: int, now: float) -> int:
    """What to give the kernel for a deadline: whole seconds from now, rounded to the nearest, so
    the kernel's deadline lands within half a second of ``until`` (either side: no drift)."""
    return math.floor((until - now) / PER_SECOND + 0.5)
