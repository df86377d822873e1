"""Is a cached attachment still in use? What ``cni-tool gc`` asks of every cache entry.

libcni >= 1.2 records the netns in each cache entry, and an entry is live while that path is a
network namespace. Debian 12's libcni 1.1.2 (upstream cnitool, containerd 1.6) records none, so
the netns is looked for elsewhere, in the order of how sure the answer is:

1. the cached result's ``interfaces[].sandbox``: the plugins' own report of the netns path;
2. a cnitool-made container ID (``cnitool-`` + 20 hex digits of SHA-512 of the netns path, see
   :func:`rdma_cni.cli.tool.container_id_for`): live while some existing netns path hashes to it.
   Every path a netns can still be reached by is either a bind mount (listed as ``nsfs`` in
   ``/proc/self/mountinfo``, under ``/run`` also spelt ``/var/run``) or ``/proc/<pid>/ns/net`` of a
   running process, so when none matches, nothing can reach the pod's netns any more. (A path that
   only reaches one through a symlink of another kind is not recognised: such an entry is stale.)
3. anything else (a runtime's own container ID, no sandbox): unknown. GC must never tear down a
   live pod's network on a guess, so it keeps these and says how many and why; ``--all`` or
   ``cni-tool del`` removes them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rdma_cni.cni.cache import CacheEntry

CNITOOL_ID = re.compile(r"cnitool-[0-9a-f]{20}")


@dataclass(frozen=True)
class Verdict:
    live: bool | None  # None: cannot be told (kept unless --all)
    why: str


def judge(
    entry: CacheEntry, is_netns: Callable[[str], bool], live_ids: Callable[[], frozenset[str]]
) -> Verdict:
    """Whether ``entry``'s attachment is live. ``live_ids`` (the cnitool IDs of every reachable netns
    path) is called only for entries that need it: the scan reads /proc."""
    if entry.netns:
        return Verdict(is_netns(entry.netns), f"netns {entry.netns}")
    sandbox = _sandbox(entry.result)
    if sandbox:
        return Verdict(is_netns(sandbox), f"no netns recorded; its result's sandbox {sandbox}")
    if CNITOOL_ID.fullmatch(entry.container_id):
        live = entry.container_id in live_ids()
        return Verdict(
            live,
            "no netns recorded; "
            + (
                "a live netns path hashes to its cnitool ID"
                if live
                else "no netns path hashes to its cnitool ID"
            ),
        )
    return Verdict(None, "no netns recorded (libcni < 1.2), no sandbox in its result, not a cnitool ID")


def _sandbox(result: dict[str, Any] | None) -> str:
    """The netns path the plugins reported (the first interface with a ``sandbox``)."""
    interfaces = (result or {}).get("interfaces")
    for iface in interfaces if isinstance(interfaces, list) else []:
        sandbox = iface.get("sandbox") if isinstance(iface, dict) else None
        if isinstance(sandbox, str) and sandbox.startswith("/"):
            return sandbox
    return ""


def netns_paths(mountinfo: str = "/proc/self/mountinfo", proc: str = "/proc") -> Iterator[str]:
    """Every path that reaches a namespace now: nsfs bind mounts and running processes' ns/net."""
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split(" ")
        if " - nsfs " not in line or len(fields) < 5:
            continue
        point = _unescape(fields[4])
        yield point
        for a, b in (("/run/", "/var/run/"), ("/var/run/", "/run/")):
            if point.startswith(a):
                yield b + point.removeprefix(a)
    for pid in os.listdir(proc):
        if pid.isdigit():
            yield f"{proc}/{pid}/ns/net"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
