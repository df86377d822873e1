"""The node's next agent waits for the one before it: a rolling update's hand-over.

A DaemonSet that surges (updateStrategy maxSurge 1) starts a node's new agent while the old one
still serves. One agent per node holds ``<socket>.lock`` (:meth:`rdma_cni.agent.server.Agent.bind`),
and its forked workers hold it with it (a lock belongs to the open file, which a fork shares): it
is free once the old agent and every call it was still running have ended. The new agent warms up
first, waits here, and then binds: the socket is the old agent's until it stops, the new one's a
few milliseconds later, and a plugin that calls in between runs in-process, as without an agent.
Waiting instead of refusing also keeps a surge pod's container from restarting in a loop.

    waited = wait_for_previous(socket_path, lambda: log.info("waiting for the running agent"))
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable


def lock_path(socket_path: str) -> str:
    return socket_path + ".lock"


def wait_for_previous(socket_path: str, on_wait: Callable[[], None] | None = None) -> float:
    """Block until no agent (nor any of its workers) holds the socket's lock; the seconds waited.
    The lock is let go again at once: :meth:`Agent.bind` takes it for good. A SIGTERM meanwhile
    ends the process (the default action: nothing of this agent is visible yet)."""
    os.makedirs(os.path.dirname(os.path.abspath(socket_path)), mode=0o755, exist_ok=True)
    fd = os.open(lock_path(socket_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    started = time.monotonic()
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return 0.0
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
        fcntl.flock(fd, fcntl.LOCK_EX)
        return time.monotonic() - started
    finally:
        os.close(fd)  # closing the only descriptor of this open file lets the lock go
