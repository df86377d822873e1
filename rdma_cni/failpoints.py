"""Test-only crash points of a plugin's transaction: ``RDMA_CNI_FAILPOINT=<step>[#n][:error|:stop]``.

Every plugin that writes ahead (rdma-macvlan, rdma-ipvlan) names its steps and calls
:meth:`Failpoints.hit` after each; the crash-safety tests kill -9 the plugin there (or inject an
I/O error, or SIGSTOP it) and prove that DEL or GC leaves the node as it was. Unset, it costs a
string compare per step. ``RDMA_CNI_FAILPOINT_ARMED=<path>`` makes it fire only while that file
exists: a daemon that the test cannot start with a fresh environment (a DaemonSet's container,
restarted by kubelet with the same env) crashes once, when the test arms it, and not again after.

    fp = Failpoints(req.env); ...; fp.hit("write-ahead")
"""

from __future__ import annotations

import errno
import logging
import os
import signal
from collections.abc import Mapping

log = logging.getLogger("rdma_cni.failpoints")


class Failpoints:
    """``RDMA_CNI_FAILPOINT``: kill -9 ourselves at a named step (crash-safety tests only)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        spec = env.get("RDMA_CNI_FAILPOINT", "")
        spec, _, action = spec.partition(":")
        self.error = action == "error"
        self.stop = action == "stop"
        step, _, nth = spec.partition("#")
        self.step = step
        self.nth = int(nth) if nth.isdigit() else 1
        self.seen = 0
        self.armed_by = env.get("RDMA_CNI_FAILPOINT_ARMED", "")

    def hit(self, step: str) -> None:
        if step != self.step or (self.armed_by and not os.path.exists(self.armed_by)):
            return
        self.seen += 1
        if self.seen == self.nth:
            if self.error:
                log.warning("failpoint %s#%d: injected error", step, self.nth)
                raise OSError(errno.EIO, f"injected failure at {step}")
            if self.stop:
                log.warning("failpoint %s#%d: SIGSTOP", step, self.nth)
                os.kill(os.getpid(), signal.SIGSTOP)
                return
            log.warning("failpoint %s#%d: SIGKILL", step, self.nth)
            os.kill(os.getpid(), signal.SIGKILL)
