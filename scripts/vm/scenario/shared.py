"""Section ``shared``: rdma-ipvlan (TKE's shared mode) on the real kernel: two pods on every bond,
each address with its own GID index, traffic, crash and GC."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from typing import Any

from .cni import pod_gid_rows
from .host import host_snapshot, ip, pod_links, run, tables, v2_index, wait_for
from .report import BONDS, OUT, STATE, SYS, R, node_policy_env

SHARED_RANGES = {"bond0": "198.51.100.100-198.51.100.109", "bond1": "198.51.100.110-198.51.100.119"}
SHARED_PING = """
import os, socket, struct, sys, time
dst, iface = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, iface.encode())
ident = os.getpid() & 0xFFFF
def csum(b):
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b)); t = (t >> 16) + (t & 0xFFFF); t += t >> 16
    return ~t & 0xFFFF
body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"shared-e2e"
pkt = body[:2] + struct.pack("!H", csum(body)) + body[4:]
end = time.time() + 10
s.settimeout(0.5)
while time.time() < end:
    s.sendto(pkt, (dst, 0))
    try:
        data, addr = s.recvfrom(2048)
    except socket.timeout:
        continue
    hl = (data[0] & 15) * 4
    if addr[0] == dst and data[hl] == 0 and struct.unpack("!H", data[hl + 4:hl + 6])[0] == ident:
        sys.exit(0)
sys.exit(1)
"""


def cni_shared(command: str, pod: str, failpoint: str | None = None) -> tuple[int, dict[str, Any] | None]:
    """The real rdma-ipvlan (shared mode, the IPVLAN default) with children of bond0 and bond1."""
    conf = {
        "cniVersion": "1.1.0",
        "name": "shared-e2e",
        "type": "rdma-ipvlan",
        "masters": ["bond0", "bond1"],
        "ranges": SHARED_RANGES,
        "sysfsRoot": SYS,
        "rdma": {"required": True, "gidTimeoutMs": 10000},
        "dataDir": str(STATE / "shared"),
        "runDir": str(STATE / "run"),
        "logFile": str(OUT / "plugin.log"),
        "logLevel": "debug",
    }
    if command == "GC":
        conf["cni.dev/valid-attachments"] = []
    env = {
        "PATH": os.environ["PATH"],
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": f"e2e-{pod}",
        "CNI_NETNS": f"/run/netns/{pod}",
        "CNI_IFNAME": "net1",
        "CNI_PATH": "/usr/lib/cni:/opt/cni/bin",
        "CNI_ARGS": f"IgnoreUnknown=true;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME={pod}",
        **node_policy_env(),
    }
    if failpoint:
        env["RDMA_CNI_FAILPOINT"] = failpoint
    t0 = time.monotonic()
    proc = run(
        [sys.executable, "-m", "rdma_cni.cli.ipvlan"],
        stdin=json.dumps(conf),
        env=env,
        timeout=180,
        ok=range(-64, 256),
    )
    try:
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        out = {"unparsable stdout": proc.stdout}
    R.fact(
        f"{command} {pod}",
        {
            "rc": proc.returncode,
            "seconds": round(time.monotonic() - t0, 2),
            "stdout": out,
            "stderr": proc.stderr[-2000:],
        },
    )
    return proc.returncode, out


def shared_held() -> list[str]:
    """The write-ahead records of rdma-ipvlan: what holds addresses."""
    return [p.name for p in sorted((STATE / "shared" / "attachments").glob("*.json"))]


def shared_ips(out: dict[str, Any] | None) -> dict[str, str]:
    """bond -> the pod's IPv4 on it, from the result."""
    names = [i["name"] for i in (out or {}).get("interfaces", [])]
    return {names[x["interface"]]: x["address"].split("/")[0] for x in (out or {}).get("ips", [])}


def shared_ping(pod: str, dst: str, iface: str) -> bool:
    proc = run(
        ["ip", "netns", "exec", pod, sys.executable, "-c", SHARED_PING, dst, iface], ok=range(-64, 256)
    )
    return proc.returncode == 0


def shared_section() -> None:
    """Shared mode on the real kernel: two pods each get an IPVLAN of bond0 and of bond1 with an
    address of their own; each address its own RoCE v2 GID at the index the plugin recorded; the
    host's index unchanged; pings pod to pod over each bond and across the wire; DEL takes the GIDs
    away; kill -9 mid-ADD leaks no address."""
    if importlib.util.find_spec("rdma_cni.cli.ipvlan") is None:
        R.skip("shared", "rdma_cni/cli/ipvlan.py is not in this checkout")
        return
    before = host_snapshot()
    host_idx = {a: v2_index(dev, a) for dev, _, addrs in (BONDS["bond0"], BONDS["bond1"]) for a in addrs}
    ip(["netns add spod1", "netns add spod2"])
    got: dict[str, dict[str, str]] = {}
    for pod in ("spod1", "spod2"):
        rc, out = cni_shared("ADD", pod)
        R.check(f"ADD {pod}: exit code", 0, rc, out)
        got[pod] = shared_ips(out)
        kinds = sorted(
            {
                link.get("linkinfo", {}).get("info_kind", "")
                for link in json.loads(run(["ip", "-n", pod, "-d", "-j", "link"]).stdout or "[]")
                if link["ifname"] != "lo"
            }
        )
        R.check(f"ADD {pod}: its children are ipvlans", ["ipvlan"], kinds)
    R.check(
        "the pods' addresses",
        {
            "spod1": {"bond0": "198.51.100.100", "bond1": "198.51.100.110"},
            "spod2": {"bond0": "198.51.100.101", "bond1": "198.51.100.111"},
        },
        got,
    )
    R.check("the host bonds keep all their addresses", before["links"], host_snapshot()["links"])
    R.fact("gid_tables_with_shared_pods", tables())
    seen: set[tuple[str, int]] = set()
    recorded: dict[tuple[str, str], Any] = {}
    for pod, by_bond in got.items():
        for bond, addr in by_bond.items():
            dev = BONDS[bond][0]
            index = v2_index(dev, addr)
            R.check(f"{pod}: {addr} has a RoCE v2 GID of its own on {dev}", True, index is not None)
            if index is not None:
                seen.add((dev, index))
            path = STATE / "run" / "gid" / f"e2e-{pod}" / f"{bond}.json"
            rec = json.loads(path.read_text()) if path.exists() else {}
            recorded[(pod, bond)] = rec.get("gidIndex")
            R.check(
                f"{pod}: the record of {bond} names that index, mode shared",
                (index, "shared"),
                (rec.get("gidIndex"), rec.get("mode")),
                rec,
            )
    R.check("four pod addresses, four GID slots", 4, len(seen))
    rows = pod_gid_rows("spod1")
    if rows is not None:
        R.check(
            "cni-tool gids inside spod1: the RoCE v2 index of each of its addresses is the recorded one",
            {a: [recorded[("spod1", b)]] for b, a in got["spod1"].items()},
            {
                a: [r.get("index") for r in rows if r.get("ipv4") == a and r.get("type") == "RoCE v2"]
                for a in got["spod1"].values()
            },
            rows,
        )
    for a, index in host_idx.items():
        dev = BONDS["bond0"][0] if a in BONDS["bond0"][2] else BONDS["bond1"][0]
        R.check(f"the host's {a} keeps its GID index", index, v2_index(dev, a))
        R.check(f"no pod took the host's slot of {a}", False, (dev, index) in seen)
    R.check(
        "ping spod1 -> spod2 over bond0 (one parent)", True, shared_ping("spod1", "198.51.100.101", "bond0")
    )
    R.check(
        "ping spod1 -> spod2 across the wire (bond0 -> bond1)",
        True,
        shared_ping("spod1", "198.51.100.111", "bond0"),
    )
    R.check("ping spod2 -> spod1 over bond1", True, shared_ping("spod2", "198.51.100.110", "bond1"))
    for pod in ("spod1", "spod2"):
        rc, _ = cni_shared("DEL", pod)
        R.check(f"DEL {pod}: exit code", 0, rc)
        R.check(f"DEL {pod}: only lo left", ["lo"], pod_links(pod))
        for bond, addr in got[pod].items():
            gone = wait_for(lambda dev=BONDS[bond][0], a=addr: v2_index(dev, a) is None, 5.0)
            R.check(f"DEL {pod}: the GID of {addr} is gone", True, gone is not None)
    R.check("no address held after DEL", [], shared_held())
    # kill -9 mid-ADD (after the second bond's address): DEL frees everything, the next pod gets .100
    rc, _ = cni_shared("ADD", "spod1", failpoint="addresses-added#2")
    R.check("kill -9 mid-ADD: killed", -9, rc)
    rc, _ = cni_shared("DEL", "spod1")
    R.check("kill -9 mid-ADD: DEL exit code", 0, rc)
    R.check("kill -9 mid-ADD: no address held", [], shared_held())
    R.check("kill -9 mid-ADD: only lo left in the pod", ["lo"], pod_links("spod1"))
    rc, out = cni_shared("ADD", "spod2")
    R.check(
        "after the crash the next pod gets the first addresses again",
        {"bond0": "198.51.100.100", "bond1": "198.51.100.110"},
        shared_ips(out),
    )
    rc, _ = cni_shared("GC", "spod2")
    R.check("GC with no valid attachment frees them", (0, []), (rc, shared_held()))
    ip(["netns del spod1", "netns del spod2"])
    R.check("host as before shared mode", before, host_snapshot())
