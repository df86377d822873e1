"""Processes the harness starts, recorded by pid and start time so that ``down`` (or the next ``up``,
after a run killed with -9) ends exactly those and never a process that reused a pid."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


class StartError(RuntimeError):
    """A component did not come up: names it and carries the tail of its log."""


@dataclass
class Proc:
    name: str
    pid: int
    start: str  # /proc/<pid>/stat field 22: tells a reused pid apart
    log: str


def start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def alive(p: Proc) -> bool:
    """The recorded process still runs: same pid and start time, and not a zombie (one whose parent,
    an ``up`` that has exited, left it to an init that reaps late)."""
    try:
        stat = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[19] == p.start != "" and stat[0] != "Z"


def tail(path: str | Path, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def in_namespaces(argv: Sequence[str], netns: str | None = None, mntns: str | None = None) -> list[str]:
    """``argv`` run inside a node's namespaces. nsenter, not ``ip netns exec``: the latter remounts
    /sys for the netns, hiding the node's own /sys and its cgroup mounts."""
    if not netns and not mntns:
        return list(argv)
    cmd = ["nsenter"]
    if mntns:
        cmd.append(f"--mount={mntns}")
    if netns:
        cmd.append(f"--net=/run/netns/{netns}")
    return [*cmd, "--", *argv]


def node_env() -> dict[str, str]:
    """This process's environment without the suite's node policy (tests/conftest.py): a cluster
    node's plugins read the policy its own install wrote (/etc/rdma-cni/node-policy.json), as on a
    real node."""
    return {k: v for k, v in os.environ.items() if k != "RDMA_CNI_NODE_POLICY"}


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    netns: str | None = None,
    mntns: str | None = None,
    env: dict[str, str] | None = None,
) -> Proc:
    """Start a long-running component in its own session (a Ctrl-C of the caller does not reach it;
    ``down`` ends it), stdout and stderr to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            in_namespaces(argv, netns, mntns),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=env if env is not None else node_env(),
        )
    return Proc(name, popen.pid, start_time(popen.pid), str(log))


def stop(procs: Sequence[Proc], grace: float = 10.0) -> None:
    """SIGTERM every recorded process still alive, then SIGKILL what outlives ``grace``."""
    live = [p for p in procs if alive(p)]
    for p in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in live):
        time.sleep(0.1)
    for p in live:
        if alive(p):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5  # SIGKILL is not instant: gone before down goes on
    while time.monotonic() < deadline and any(alive(p) for p in live):
        time.sleep(0.05)
    for p in live:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(p.pid, os.WNOHANG)


def dump(procs: Sequence[Proc]) -> list[dict[str, object]]:
    return [asdict(p) for p in procs]


def load(items: Sequence[dict[str, object]]) -> list[Proc]:
    return [Proc(str(i["name"]), int(str(i["pid"])), str(i["start"]), str(i["log"])) for i in items]


def wait_for(
    what: str, check: Callable[[], object], timeout: float, proc: Proc | None = None, interval: float = 0.25
) -> None:
    """Poll ``check()`` until true; a component that died or never became ready is named with the
    tail of its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not alive(proc):
            raise StartError(
                f"{proc.name} exited while waiting for {what}; the tail of {proc.log}:\n{tail(proc.log)}"
            )
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(interval)
    log = f"; the tail of {proc.log}:\n{tail(proc.log)}" if proc else ""
    raise StartError(f"{proc.name if proc else what}: not ready within {timeout:.0f} s ({what}){log}")


def json_dump(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.rename(path)
