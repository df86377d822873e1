"""What the agent's processes tell its metrics process: one datagram per finished CNI call, per
reconcile pass, per refused call.

The counts live in the metrics process (``server``), but the calls run in forked workers
and reconcile in forked jobs, each gone after a while: so each sends one small JSON datagram on a
``SOCK_DGRAM`` socketpair the agent creates before it forks anything. A socketpair's datagrams are
bounded by the socket buffer (~200 KiB: thousands of events), not by ``max_dgram_qlen``, and the
send is non-blocking: when the metrics process is gone or stuck and the buffer is full, the event is
dropped, never the call delayed. The agent keeps the receiving end open itself, so a metrics
process that is replaced finds the events sent meanwhile. A worker sends only after it answered the
client, so the report is never on the call's path. Stdlib only: the workers import nothing more.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any

# The verbs a label may carry; anything else (a broken client) is counted as "other", so no caller
# can grow the label set without bound.
VERBS = frozenset({"ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"})
MAX_EVENT = 4096

_tx: socket.socket | None = None


def open_channel() -> socket.socket:
    """Create the channel; this process (and every fork of it) reports on its sending end.
    Returns the receiving end, for the metrics process."""
    global _tx
    tx, rx = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    tx.setblocking(False)
    tx.set_inheritable(False)  # inherited by fork (as every fd), never by an exec'd program
    rx.set_inheritable(False)
    _tx = tx
    return rx


def close_channel() -> None:
    global _tx
    if _tx is not None:
        _tx.close()
        _tx = None


def _send(event: dict[str, Any]) -> None:
    if _tx is None:
        return
    try:
        _tx.send(json.dumps(event, separators=(",", ":")).encode())
    except OSError:  # full (EAGAIN) or nobody left to read: drop the event, never delay the caller
        pass


def cni_code(exit_code: int, stdout: str) -> int:
    """The CNI error code of a failed call (its stdout's ``code``; a plugin exits 1 whatever the
    error), 0 for a success, the exit code when the answer carries none."""
    if exit_code == 0:
        return 0
    try:
        code = json.loads(stdout).get("code")
    except (ValueError, AttributeError):
        return exit_code
    return code if isinstance(code, int) and not isinstance(code, bool) and code else exit_code


def report_call(plugin: str, verb: str, code: int, seconds: float, cpu: CallCpu | None = None) -> None:
    """A call a worker served: its plugin, verb, CNI error code (0: success), duration from GO to
    the answer, and the CPU it cost by part."""
    event: dict[str, Any] = {"e": "call", "plugin": plugin, "verb": verb, "code": code}
    event["s"] = round(seconds, 6)
    if cpu is not None:
        event["cpu"] = [round(cpu.plugin, 6), round(cpu.delegates, 6), round(cpu.kube_api, 6)]
    _send(event)


def report_reconcile(repaired: int, failed: int) -> None:
    _send({"e": "reconcile", "repaired": repaired, "failed": failed})


def report_refused() -> None:
    """The agent refused a call (every worker busy, or a worker that cannot run it): the client
    ran it in-process."""
    _send({"e": "refused"})


@dataclass(frozen=True)
class CallCpu:
    """What one call cost in CPU seconds: our plugin code in the worker (its Kubernetes API requests
    not included), the programs it ran (delegates such as the cluster network's plugin: the
    worker's reaped children), and its Kubernetes API requests (TLS, HTTP)."""

    plugin: float
    delegates: float
    kube_api: float


@dataclass(frozen=True)
class Call:
    plugin: str
    verb: str
    code: int
    seconds: float
    cpu: CallCpu | None = None

    @property
    def result(self) -> str:
        return "ok" if self.code == 0 else "error"


@dataclass(frozen=True)
class Reconcile:
    repaired: int
    failed: int


@dataclass(frozen=True)
class Refused:
    pass


Event = Call | Reconcile | Refused


def decode(data: bytes) -> Event | None:
    """One datagram -> an event; None for anything malformed (logged by the caller)."""
    try:
        raw = json.loads(data)
        kind = raw["e"]
        if kind == "call":
            verb = str(raw["verb"])
            cpu = raw.get("cpu")
            parts = CallCpu(*(max(0.0, float(x)) for x in cpu)) if cpu is not None else None
            return Call(str(raw["plugin"]), verb if verb in VERBS else "other", int(raw["code"]),
                        float(raw["s"]), parts)
        if kind == "reconcile":
            return Reconcile(int(raw["repaired"]), int(raw["failed"]))
        if kind == "refused":
            return Refused()
    except (ValueError, KeyError, TypeError):
        return None
    return None
