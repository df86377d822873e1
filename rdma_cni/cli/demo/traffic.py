"""Step 5 of the demo: traffic. One ICMP echo at a time from inside a pod (a raw socket bound to the
interface: no ping binary needed in the pod): the switch from each of the pod's bond interfaces
(:func:`exclusive`); in shared mode also the other pod on every bond (:func:`shared`).
"""

from __future__ import annotations

import sys

from rdma_cni.cli.demo.installed import Demo
from rdma_cni.cli.demo.node import bond_addr
from rdma_cni.cli.demo.shared_node import SharedDemo
from rdma_cni.cli.demo.shell import DemoFailed, banner, run, say

PING = r"""
import os, socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"IFACE")
ident = os.getpid() & 0xFFFF
def csum(b):
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b)); t = (t >> 16) + (t & 0xFFFF); t += t >> 16
    return ~t & 0xFFFF
body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"rdma-cni"
pkt = body[:2] + struct.pack("!H", csum(body)) + body[4:]
s.settimeout(0.5)
end = time.time() + 5
while time.time() < end:
    t0 = time.perf_counter(); s.sendto(pkt, ("DST", 0))
    try:
        data, addr = s.recvfrom(2048)
    except socket.timeout:
        continue
    hl = (data[0] & 15) * 4
    if addr[0] == "DST" and data[hl] == 0 and struct.unpack("!H", data[hl + 4:hl + 6])[0] == ident:
        print(f"{(time.perf_counter() - t0) * 1000:.2f}"); sys.exit(0)
sys.exit(1)
"""


def ping(d: Demo, src_if: str, dst: str) -> float:
    """One ICMP echo from the pod out of ``src_if``; the round trip in ms (no ping binary needed)."""
    code = PING.replace("DST", dst).replace("IFACE", src_if)
    proc = run("ip", "netns", "exec", d.pod, sys.executable, "-c", code, check=False)
    if proc.returncode != 0:
        raise DemoFailed(f"ping {dst} from the pod's {src_if} got no reply: {proc.stderr.strip()}")
    return float(proc.stdout.strip())


def pod_pings(d: SharedDemo, i: int, targets: list[tuple[str, str]]) -> list[float]:
    """One ICMP echo per (interface, destination) from pod i: the exclusive demo's probe, run for
    each target in one process (a process per ping is most of the step's time)."""
    codes = [PING.replace("DST", dst).replace("IFACE", iface) for iface, dst in targets]
    driver = (
        f"for code in {codes!r}:\n"
        "    try:\n        exec(code, {})\n"
        "    except SystemExit as end:\n        print('lost', flush=True) if end.code else None\n"
    )
    proc = run("ip", "netns", "exec", d.pods[i], sys.executable, "-c", driver, check=False)
    replies = proc.stdout.split()
    replies += ["lost"] * (len(targets) - len(replies))  # the probe itself failed: the rest too
    lost = [
        f"{dst} from {iface}" for (iface, dst), r in zip(targets, replies, strict=True) if r == "lost"
    ]
    if lost:
        raise DemoFailed(f"{d.pod_names[i]}: no reply to ping {', '.join(lost)} {proc.stderr.strip()}")
    return [float(r) for r in replies]


def exclusive(d: Demo) -> None:
    banner("5. Traffic: ping the switch from each of the pod's bond interfaces")
    for i, bond in d.pod_bond_list():
        peer = bond_addr(i)[1].split("/")[0]
        say(f"pod {bond} -> {peer}: reply in {ping(d, bond, peer)} ms")



def shared(d: SharedDemo, addrs: list[dict[str, str]]) -> None:
    banner("5. Traffic: each pod pings the switch on every bond, and the other pod")
    for i, addr in enumerate(addrs):
        other = addrs[1 - i]
        switch = [(b, bond_addr(d.bonds.index(b))[1].split("/")[0]) for b in addr]
        replies = pod_pings(d, i, switch + [(b, other[b]) for b in addr])
        for (b, dst), ms in zip(switch, replies, strict=False):
            say(f"pod {d.pod_names[i]} {b} {addr[b]} -> switch {dst}: reply in {ms} ms")
        for b, ms in zip(addr, replies[len(switch) :], strict=True):
            peer = f"pod {d.pod_names[1 - i]} {other[b]}"
            say(f"pod {d.pod_names[i]} {b} {addr[b]} -> {peer}: reply in {ms} ms")
