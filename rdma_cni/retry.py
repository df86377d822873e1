"""Looking again at something that is about to become true, for a bounded time.

Readiness probes run as the DaemonSet's containers start, a second or two before what they check
(the agent's socket, the device plugin's status) is there; a probe that answered at once left the
pod not Ready until the probe's next period, which a rolling update waits for on every node. Both
probes (``rdma-agent --probe``, ``cni-tool doctor --wait``) look again on this one loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def look_until(
    look: Callable[[], T],
    done: Callable[[T], bool],
    wait: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``look()``, again every ``interval`` seconds while ``done`` says no, for up to ``wait``
    seconds (none when ``wait`` <= 0); the last look is the answer. A look that would start after
    the deadline is not taken: the caller's own timeout (kubelet's) is set with ``wait`` in mind."""
    deadline = clock() + max(wait, 0.0)
    seen = look()
    while not done(seen) and clock() + interval <= deadline:
        sleep(interval)
        seen = look()
    return seen
