"""Processes and the kernel's view: run a command, and read GID tables, addresses and the host's
snapshot with plain ``open`` calls (an oracle independent of the project's own reader)."""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

from .report import BONDS, GID_SLOTS, SYS, ZERO_GID, CommandFailed


def run(
    argv: list[str],
    *,
    stdin: str | None = None,
    timeout: float = 60,
    ok: Iterable[int] = (0,),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    print("$ " + shlex.join(argv), flush=True)
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode not in tuple(ok):
        raise CommandFailed(argv, proc)
    return proc


def ip(lines: Iterable[str], netns: str | None = None) -> None:
    """Several ``ip`` commands in one process (``ip -batch``): one spawn instead of one per line."""
    text = "\n".join(lines) + "\n"
    print(text, end="", flush=True)
    run(["ip", *(["-n", netns] if netns else []), "-batch", "-"], stdin=text)


def retry(what: Callable[[], Any], seconds: float) -> Any:
    """Netns teardown is asynchronous in the kernel: what depends on it is retried for a while."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return what()
        except CommandFailed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read(path: str) -> str | None:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read().decode().strip()
    except OSError:  # an empty GID slot's types/ndevs read as EINVAL
        return None


# ------------------------------------------------------------------ the kernel's view


def gid_table(device: str, port: int = 1) -> list[dict[str, Any]]:
    """The non-empty slots of a port's GID table, exactly as sysfs shows them."""
    base = f"{SYS}/class/infiniband/{device}/ports/{port}"
    table = []
    for i in range(GID_SLOTS):
        gid = read(f"{base}/gids/{i}")
        if gid is None or gid == ZERO_GID:
            continue
        table.append(
            {
                "index": i,
                "gid": gid,
                "type": read(f"{base}/gid_attrs/types/{i}") or "",
                "ndev": read(f"{base}/gid_attrs/ndevs/{i}") or "",
            }
        )
    return table


def mapped_gid(ipv4: str) -> str:
    return ipaddress.IPv6Address(f"::ffff:{ipv4.split('/')[0]}").exploded


def v2_entry(device: str, ipv4: str) -> dict[str, Any] | None:
    """The RoCE v2 slot holding an IPv4 address's GID, found by value (rxe: 1, mlx5: 3)."""
    gid = mapped_gid(ipv4)
    return next((e for e in gid_table(device) if e["gid"] == gid and e["type"] == "RoCE v2"), None)


def v2_index(device: str, ipv4: str) -> int | None:
    entry = v2_entry(device, ipv4)
    return None if entry is None else int(entry["index"])


def tables() -> dict[str, list[dict[str, Any]]]:
    return {dev: gid_table(dev) for dev, _, _ in BONDS.values()}


def wait_for(what: Callable[[], bool], seconds: float) -> float | None:
    """Seconds until ``what()`` held (polled every 10 ms), or None on timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if what():
            return round(time.monotonic() - t0, 3)
        time.sleep(0.01)
    return None


def addresses(ifname: str, netns: str | None = None) -> list[str]:
    """IPv4 addresses of a link, in the kernel's order; secondaries marked."""
    argv = ["ip", *(["-n", netns] if netns else []), "-j", "-4", "addr", "show", "dev", ifname]
    data = json.loads(run(argv).stdout or "[]")
    return [
        f"{a['local']}/{a['prefixlen']}" + (" secondary" if a.get("secondary") else "")
        for link in data
        for a in link.get("addr_info", [])
    ]


def host_snapshot() -> dict[str, Any]:
    """What "the host as it was" means: every link, its master, its global addresses, GID tables."""
    data = json.loads(run(["ip", "-j", "addr", "show"]).stdout)
    links = {
        link["ifname"]: {
            "master": link.get("master"),
            "addrs": [
                f"{a['local']}/{a['prefixlen']}" + (" secondary" if a.get("secondary") else "")
                for a in link.get("addr_info", [])
                if a.get("scope") == "global"
            ],
        }
        for link in data
    }
    return {"links": links, "gids": tables()}


def pod_links(netns: str) -> list[str]:
    return sorted(
        link["ifname"] for link in json.loads(run(["ip", "-n", netns, "-j", "link", "show"]).stdout)
    )


def netns_mode() -> dict[str, Any]:
    return {
        "rdma_system": run(["rdma", "system", "show"]).stdout.strip(),
        "ib_core.netns_mode": read(f"{SYS}/module/ib_core/parameters/netns_mode"),
    }


def v2_index6(device: str, ipv6: str) -> int | None:
    """The RoCE v2 slot of an IPv6 address's GID (the address itself)."""
    gid = ipaddress.IPv6Address(ipv6.split("/")[0]).exploded
    return next((int(e["index"]) for e in gid_table(device) if e["gid"] == gid and e["type"] == "RoCE v2"),
                None)


def addresses6(ifname: str) -> list[str]:
    """Global IPv6 addresses of a link, in the kernel's order. Filtered here, not by ``ip ... scope
    global``: its JSON then prints an empty object for each address it filtered out."""
    data = json.loads(run(["ip", "-j", "-6", "addr", "show", "dev", ifname]).stdout or "[]")
    return [f"{a['local']}/{a['prefixlen']}" for link in data for a in link.get("addr_info", [])
            if a.get("scope") == "global" and "local" in a]
