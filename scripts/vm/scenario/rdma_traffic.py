"""RDMA traffic for the ``plugin`` section: ``ibv_rc_pingpong`` between the host's bonds and between
two pods, proven on the wire by the devices' counters."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from .host import read, run, v2_index, wait_for
from .report import PINGPONG_PORT, ROCE_PORT, SYS, R


def counters(dev: str) -> dict[str, int]:
    base = f"{SYS}/class/infiniband/{dev}/ports/1/hw_counters"
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    values = {n: read(f"{base}/{n}") for n in names}
    return {n: int(v) for n, v in values.items() if v and v.isdigit() and int(v)}


def listening(pid: int) -> bool:
    """Is the pingpong server listening? Read in its own netns through /proc/<pid>/net."""
    for name in ("tcp", "tcp6"):
        text = read(f"/proc/{pid}/net/{name}") or ""
        if any(f":{PINGPONG_PORT:04X} " in line and " 0A " in line for line in text.splitlines()):
            return True
    return False


def pingpong(
    label: str, server: tuple[str | None, str, int], client: tuple[str | None, str, int], server_ip: str
) -> dict[str, Any]:
    """ibv_rc_pingpong server/client pair; returns what happened, with the kernel's view of why."""

    def argv(ns: str | None, dev: str, idx: int, limit: int) -> list[str]:
        pre = ["ip", "netns", "exec", ns] if ns else []
        return [
            *pre,
            "timeout",
            str(limit),
            "ibv_rc_pingpong",
            "-d",
            dev,
            "-g",
            str(idx),
            "-n",
            "5",
            "-s",
            "1024",
        ]

    before = {server[1]: counters(server[1]), client[1]: counters(client[1])}
    print("$ " + shlex.join(argv(*server, 40)) + " &", flush=True)
    srv = subprocess.Popen(argv(*server, 40), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: listening(srv.pid), 15)
    cli = run([*argv(*client, 25), server_ip], ok=range(-64, 256), timeout=60)
    if cli.returncode != 0:
        time.sleep(1)
        srv.terminate()  # `timeout` passes it on to the server
    srv_out, _ = srv.communicate(timeout=60)
    after = {dev: counters(dev) for dev in before}
    outcome = {
        "ok": cli.returncode == 0 and srv.returncode == 0,
        "client_rc": cli.returncode,
        "server_rc": srv.returncode,
        "client": (cli.stdout + cli.stderr).strip().splitlines()[-6:],
        "server": srv_out.strip().splitlines()[-6:],
        "counters_delta": {
            dev: {k: v - before[dev].get(k, 0) for k, v in after[dev].items() if v != before[dev].get(k, 0)}
            for dev in after
        },
    }
    R.fact(f"pingpong {label}", outcome)
    return outcome


def pingpong_host() -> None:
    """Verbs work in the guest at all: mlx5_bond_0 to itself over the host's own IP."""
    idx = v2_index("mlx5_bond_0", "198.51.100.10")
    if idx is None:
        R.check("host netns pingpong possible", True, False)
        return
    outcome = pingpong(
        "host netns, mlx5_bond_0 -> itself",
        (None, "mlx5_bond_0", idx),
        (None, "mlx5_bond_0", idx),
        "198.51.100.10",
    )
    R.check(f"ibv_rc_pingpong -g {idx} in the host netns (verbs work in this guest)", True, outcome["ok"])


def pingpong_pods(host_idx: dict[str, int | None]) -> None:
    """pod2 -> pod1 over the product's layout (one shared rxe per bond, the GID on a pod macvlan)."""
    i1, i2 = host_idx["198.51.100.10/24"], host_idx["198.51.100.11/24"]
    if i1 is None or i2 is None:
        return
    debug = "/sys/kernel/debug/dynamic_debug/control"
    try:
        Path(debug).write_text("module rdma_rxe +p\n")  # rxe says why it drops a packet only here
    except OSError as e:
        R.fact("rdma_rxe dynamic debug unavailable", str(e))
    run(["dmesg", "-C"])
    outcome = pingpong(
        "pod2 -> pod1 (shared rxe per bond)",
        ("pod1", "mlx5_bond_0", i1),
        ("pod2", "mlx5_bond_1", i2),
        "198.51.100.10",
    )
    log = run(["dmesg"]).stdout.splitlines()
    try:
        Path(debug).write_text("module rdma_rxe -p\n")
    except OSError:
        pass
    noise = ("state = ", "state -> ", "max_wr", "sq_draining", "set active", "added ")
    rxe = [line for line in log if "rxe" in line.lower() and not any(n in line for n in noise)]
    reasons = [
        line for line in rxe if any(k in line for k in ("no route", "unreachable", "not reachable", "err"))
    ]
    if outcome["ok"]:
        R.fact("pod-to-pod RDMA", f"works on {os.uname().release}")
        return
    # where rxe can receive at all: its UDP socket (port 4791) in the host netns vs the pod's
    host_udp = read("/proc/net/udp") or ""
    pod_udp = run(["ip", "netns", "exec", "pod1", "cat", "/proc/net/udp"]).stdout
    listeners = {
        "host netns": f":{ROCE_PORT:04X} " in host_udp,
        "pod1 netns": f":{ROCE_PORT:04X} " in pod_udp,
    }
    sent = outcome["counters_delta"].get("mlx5_bond_1", {}).get("sent_pkts", 0)
    received = outcome["counters_delta"].get("mlx5_bond_0", {}).get("rcvd_pkts", 0)
    if reasons:
        reason = reasons[0]
    elif sent and not received and not listeners["pod1 netns"]:
        reason = (
            f"mlx5_bond_1 sent {sent} RoCE v2 packets, mlx5_bond_0 received none: rxe has its UDP/4791 "
            "socket only in the host netns, not in pod1's, where the packets arrive on the macvlan"
        )
    else:
        reason = "no rdma_rxe message; counters: " + json.dumps(outcome["counters_delta"])
    R.fact(
        "LIMIT pod-to-pod RDMA over a shared Soft-RoCE device",
        {
            "kernel": os.uname().release,
            "reason": reason.split("] ", 1)[-1],
            "client": outcome["client"],
            "kernel_log": rxe[-12:],
            "udp_4791_socket": listeners,
        },
    )
