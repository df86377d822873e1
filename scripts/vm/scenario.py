#!/usr/bin/env python3
"""The real-kernel end-to-end scenario of rdma-cni; runs inside the vm-e2e guest.

Started by ``scripts/vm-e2e scenario`` on Debian's stock kernel, as root, in a throw-away VM. It
builds the product's node layout — active-backup bonds over veth "cables", a Soft-RoCE device per
bond named like the product (``mlx5_bond_N``), addresses from 198.51.100.0/24 — and then:

* ``kernel``: moves addresses with plain ``ip`` commands (no project code) and dumps the real GID
  table after every step: the kernel facts the plugin relies on, and the trace a GID-table model
  (``rdma_cni/sim``) is compared against.
* ``plugin``: runs the real ``rdma-macvlan`` plugin through the CNI protocol for two pods on two
  bonds: GID index in the pod equals the host's, RDMA traffic between the pods, DEL with the netns
  alive and already deleted, secondary address, idempotent DEL.
* ``crash``: kill -9 / failures mid-ADD, then DEL or GC.
* ``reboot``: a pod holding bond0's IPv4 and IPv6 (both GIDs at the host's index), its netns gone,
  bond0 re-addressed by the node's config: DEL keeps the new addresses, the new IPv4's GID sits at
  the unified index, ``gid/host.json`` follows.
* ``dualstack``: bond1's IPv6 added before its IPv4 (its GID at the lower index): a pod takes both,
  each family's GID sits at its host index in the pod and again after DEL.
* ``exclusive``: the kernel in ``exclusive`` RDMA netns mode: ADD fails clearly and changes nothing.

``VM_E2E_SECTIONS=setup,dualstack`` runs only the sections named (``setup`` builds the node; a
developer's quick look at one section: the others are then reported as skipped).

Every outcome is one JSON line in ``$VM_OUT/results.jsonl`` (``kind`` check/fact/skip; a check has
``ok``, ``expected``, ``actual``); ``tests/test_vm_e2e.py`` asserts on them. The GID table is read
here with plain ``open`` calls — an oracle independent of the project's own reader, which is
cross-checked against it. Few processes are spawned: under TCG each costs ~0.25 s.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

OUT = Path(os.environ.get("VM_OUT", "/tmp/vm-e2e-out"))
STATE = Path("/run/vm-e2e")  # the plugin's dataDir/runDir inside the guest (tmpfs)
SYS = "/sys"
GID_SLOTS = 32  # slots scanned per table: rxe fills from 0, the scenario never uses more than a few
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
PINGPONG_PORT = 18515
ROCE_PORT = 4791  # RoCE v2 is UDP to this port

# bond -> (RDMA device, slaves, addresses primary first). bond0/bond1 are wired back to back by
# the veth pairs a0-b0 and a1-b1, so pods on them can reach each other; bond2 (dummy slaves) is the
# kernel section's own, so its experiments never disturb the plugin's bonds.
BONDS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "bond0": ("mlx5_bond_0", ("a0", "a1"), ("198.51.100.10/24", "198.51.100.20/24")),
    "bond1": ("mlx5_bond_1", ("b0", "b1"), ("198.51.100.11/24",)),
    "bond2": ("mlx5_bond_2", ("d0", "d1"), ("198.51.100.30/24", "198.51.100.31/24")),
}


class CommandFailed(RuntimeError):
    def __init__(self, argv: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
        self.proc = proc


class Results:
    """The JSON-lines report; also echoed readably to stdout (the guest log)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("w")
        self.section = "setup"
        self.failed = 0
        self.t0 = time.monotonic()

    def write(self, kind: str, name: str, **fields: Any) -> None:
        rec = {
            "kind": kind,
            "section": self.section,
            "name": name,
            "t": round(time.monotonic() - self.t0, 2),
            **fields,
        }
        self.file.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        self.file.flush()

    def check(self, name: str, expected: Any, actual: Any, detail: Any = None) -> bool:
        ok = bool(expected == actual)
        self.failed += not ok
        self.write("check", name, ok=ok, expected=expected, actual=actual, detail=detail)
        print(
            f"{'PASS' if ok else 'FAIL'} [{self.section}] {name}: expected {expected!r}, got {actual!r}",
            flush=True,
        )
        return ok

    def fact(self, name: str, value: Any) -> None:
        self.write("fact", name, value=value)
        print(f"FACT [{self.section}] {name}: {json.dumps(value, default=str)[:400]}", flush=True)

    def skip(self, name: str, reason: str) -> None:
        self.write("skip", name, reason=reason)
        print(f"SKIP [{self.section}] {name}: {reason}", flush=True)


R = Results(OUT / "results.jsonl")


# ------------------------------------------------------------------ processes


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


# ------------------------------------------------------------------ setup


def build_node() -> None:
    run(["modprobe", "bonding", "max_bonds=0"])  # else the module creates a bond0 of its own
    run(["modprobe", "-a", "veth", "dummy", "macvlan", "rdma_rxe"])
    lines = [
        "link add a0 type veth peer name b0",
        "link add a1 type veth peer name b1",
        "link add d0 type dummy",
        "link add d1 type dummy",
    ]
    for bond, (_dev, slaves, addrs) in BONDS.items():
        lines.append(f"link add {bond} type bond mode active-backup miimon 100")
        lines += [f"link set {s} master {bond}" for s in slaves]
        lines += [f"addr add {a} dev {bond}" for a in addrs]
        lines.append(f"link set {bond} up")
    ip(lines)
    # rxe takes the port's default GID (slot 0) from a netdev with carrier: add it only once the
    # bonds' miimon saw their slaves up (on 7.2, an rxe added earlier was seen without slot 0)
    carrier = wait_for(lambda: all(read(f"{SYS}/class/net/{b}/carrier") == "1" for b in BONDS), 10.0)
    R.fact("seconds until every bond had carrier", carrier)
    batch = "".join(f"link add {dev} type rxe netdev {bond}\n" for bond, (dev, _, _) in BONDS.items())
    run(["rdma", "-b", "-"], stdin=batch)
    R.fact("kernel", os.uname().release)
    R.fact("netns_mode", netns_mode())
    R.fact("gid_tables_initial", tables())
    for bond, (dev, _, addrs) in BONDS.items():
        for a in addrs:
            R.check(f"host {a} on {bond} has a RoCE v2 GID on {dev}", True, v2_index(dev, a) is not None)
    R.check(
        "rxe publishes the IPv4 RoCE v2 GID at index 1 (mlx5: 3)", 1, v2_index("mlx5_bond_0", "198.51.100.10")
    )
    cross_check_project_reader()


def cross_check_project_reader() -> None:
    """The project's sysfs reader must see the same GID tables as this independent one."""
    if importlib.util.find_spec("rdma_cni.rdma.sysfs") is None:
        R.skip("project GID reader matches sysfs", "rdma_cni/rdma/sysfs.py is not present")
        return
    from rdma_cni.rdma import sysfs as project

    for bond, (dev, _, addrs) in BONDS.items():
        port = project.port_for_netdev(SYS, bond)
        R.check(f"project reader: RDMA port of {bond}", (dev, 1), port and (port.device, port.port))
        theirs = [(e.index, e.raw, e.type) for e in project.read_gids(SYS, dev, 1) if e.index < GID_SLOTS]
        ours = [(e["index"], e["gid"], e["type"]) for e in gid_table(dev)]
        R.check(f"project reader: GID table of {dev}", ours, theirs)
        for a in addrs:
            ipv4 = a.split("/")[0]
            R.check(
                f"project reader: RoCE v2 index of {ipv4}",
                v2_index(dev, a),
                project.roce_v2_index(SYS, dev, 1, ipv4),
            )


# ------------------------------------------------------------------ section: kernel


class ModelWatch:
    """The project's simulated RDMA node (``rdma_cni.sim``: the GID-table model the netns tests run
    on) watching the very same address moves as the real kernel, compared slot by slot.

    It listens to the guest's real rtnetlink events for bond2 and its macvlans in pods ``k*`` and
    writes its own sysfs tree; after every step both trees are read with the same reader.
    """

    DEVICE = "mlx5_bond_2"

    def __init__(self) -> None:
        self.node: Any = None
        self.root = ""
        self.why: str | None = None

    def open(self) -> None:
        try:
            from rdma_cni.sim.model import table_snapshot  # noqa: F401 - present with the node
            from rdma_cni.sim.node import SimNode
            from rdma_cni.sim.tree import SimBond
        except ImportError as e:
            self.why = f"rdma_cni.sim has no SimNode/table_snapshot yet ({e})"
            return
        self.root = tempfile.mkdtemp(prefix="vm-e2e-sim-")
        try:
            self.node = SimNode(
                self.root, [SimBond("bond2", self.DEVICE)], pods_dir="/run/netns", pods_prefix="k"
            ).open()
        except Exception as e:  # noqa: BLE001 - the model's failure is a finding, the scenario goes on
            R.check(
                "model: simulated node opens on the real kernel",
                None,
                f"{type(e).__name__}: {e}",
                traceback.format_exc(),
            )
            self.node = None
            self.why = "the simulated node did not open"
            return
        self.compare("initial state")

    def sync(self) -> None:
        if self.node is not None:
            self.node.process()

    def compare(self, label: str) -> None:
        if self.node is None:
            return
        from rdma_cni.sim.model import table_snapshot

        section, R.section = R.section, "model"
        try:
            self.node.process()
            real = table_snapshot(SYS, [self.DEVICE])
            modelled = table_snapshot(self.root, [self.DEVICE])
            R.check(f"model matches the real kernel: {label}", real, modelled)
        except Exception as e:  # noqa: BLE001 - a crash in the model is recorded as a failed check
            R.check(
                f"model matches the real kernel: {label}",
                None,
                f"{type(e).__name__}: {e}",
                traceback.format_exc(),
            )
        finally:
            R.section = section

    def close(self) -> None:
        if self.node is not None:
            self.node.close()
        if self.why:
            section, R.section = R.section, "model"
            R.skip("model", self.why)
            R.section = section


MODEL = ModelWatch()


class Trace:
    """Address moves done with plain ``ip`` and the GID table after each: the model's test data."""

    def __init__(self, name: str, device: str) -> None:
        self.name = name
        self.device = device
        self.steps: list[dict[str, Any]] = []

    def step(self, label: str, lines: list[str], netns: str | None = None) -> list[dict[str, Any]]:
        ip(lines, netns)
        table = gid_table(self.device)
        self.steps.append({"label": label, "netns": netns, "commands": lines, "table": table})
        MODEL.compare(f"{self.name}: {label}")
        return table

    def netns(self, lines: list[str]) -> None:
        """Namespaces come and go between steps; the model notices them on its next look."""
        ip(lines)
        MODEL.sync()

    def record(self) -> None:
        R.fact(f"trace {self.name}", {"device": self.device, "steps": self.steps})


def kernel_section() -> None:
    """What the plugin's design rests on, seen on the real kernel with bond2/mlx5_bond_2."""
    dev, (a30, a31) = "mlx5_bond_2", BONDS["bond2"][2]
    host = {a: v2_index(dev, a) for a in (a30, a31)}

    MODEL.open()
    try:
        moves(dev, a30, a31, host)
    finally:
        MODEL.close()


def moves(dev: str, a30: str, a31: str, host: dict[str, int | None]) -> None:
    # ADD in the design's order: macvlan made in the pod, no IPv6 link-local, host addresses
    # deleted (secondary first: deleting a primary deletes its secondaries), pod addresses added,
    # then link up.
    t = Trace("move-and-back", dev)
    t.netns(["netns add k1"])
    t.step("macvlan created in pod k1", ["link add link bond2 name h4tmp netns k1 type macvlan mode bridge"])
    t.step(
        "renamed, addrgenmode none", ["link set h4tmp name bond2", "link set bond2 addrgenmode none"], "k1"
    )
    t.step("host addresses deleted", [f"addr del {a31} dev bond2", f"addr del {a30} dev bond2"])
    t.step("pod addresses added", [f"addr add {a30} dev bond2", f"addr add {a31} dev bond2"], "k1")
    t.step("pod link up", ["link set bond2 up"], "k1")
    for a in (a30, a31):
        entry = v2_entry(dev, a)
        R.check(f"moved {a}: pod GID index equals the host's", host[a], entry and entry["index"])
        R.check(f"moved {a}: GID ndev is the pod-side name", "bond2", entry and entry["ndev"])
    t.step("pod link deleted", ["link del bond2"], "k1")
    t.step("host addresses back", [f"addr add {a30} dev bond2", f"addr add {a31} dev bond2"])
    for a in (a30, a31):
        R.check(f"DEL (pod link first): {a} back at the host's index", host[a], v2_index(dev, a))
    t.record()

    # Link up before the address arrives: the pod's IPv6 link-local takes the freed slot (V6).
    v = Trace("link-up-before-address", dev)
    v.netns(["netns add k2"])
    v.step("macvlan created in pod k2", ["link add link bond2 name h4tmp netns k2 type macvlan mode bridge"])
    v.step("host addresses deleted", [f"addr del {a31} dev bond2", f"addr del {a30} dev bond2"])
    v.step("pod link up (IPv6 link-local on)", ["link set h4tmp up"], "k2")
    wait_for(lambda: len(gid_table(dev)) > 1, 2.0)  # the link-local GID follows DAD-less address setup
    v.step("pod addresses added", [f"addr add {a30} dev h4tmp", f"addr add {a31} dev h4tmp"], "k2")
    R.fact(f"link-up-before-address: pod index of {a30} (host had {host[a30]})", v2_index(dev, a30))
    v.step("pod link deleted", ["link del h4tmp"], "k2")
    v.step("host addresses back", [f"addr add {a30} dev bond2", f"addr add {a31} dev bond2"])
    v.record()

    # The runtime deletes the netns before DEL: the macvlan and its addresses vanish with it.
    g = Trace("netns-deleted-first", dev)
    g.netns(["netns add k3"])
    g.step("macvlan created in pod k3", ["link add link bond2 name h4tmp netns k3 type macvlan mode bridge"])
    g.step("host addresses deleted", [f"addr del {a31} dev bond2", f"addr del {a30} dev bond2"])
    g.step(
        "pod addresses added, up",
        [
            "link set h4tmp addrgenmode none",
            f"addr add {a30} dev h4tmp",
            f"addr add {a31} dev h4tmp",
            "link set h4tmp up",
        ],
        "k3",
    )
    ip(["netns del k3", "netns del k2", "netns del k1"])
    gone = wait_for(lambda: v2_index(dev, a30) is None, 5.0)
    R.fact("netns deleted: seconds until its GIDs left the table (asynchronous)", gone)
    MODEL.compare("netns-deleted-first: netns deleted, its GIDs gone")
    g.step("host addresses back", [f"addr add {a30} dev bond2", f"addr add {a31} dev bond2"])
    for a in (a30, a31):
        R.check(f"netns deleted first: {a} back at the host's index", host[a], v2_index(dev, a))
    g.record()
    R.check("bond2 addresses as before", [a30, a31 + " secondary"], addresses("bond2"))


# ------------------------------------------------------------------ section: plugin


def cni(
    command: str,
    pod: str,
    bond: str,
    *,
    netns: str | None = None,
    rdma: dict[str, Any] | None = None,
    prev: dict[str, Any] | None = None,
    ifname: str = "net1",
    extra: dict[str, Any] | None = None,
    failpoint: str | None = None,
) -> tuple[int, dict[str, Any] | None, str]:
    """Call the real rdma-macvlan entry point as a runtime does (env + config on stdin).

    ``bond`` is the one master the network may use, or several separated by commas."""
    conf: dict[str, Any] = {
        "cniVersion": "1.1.0",
        "name": "rdma-e2e",
        "type": "rdma-macvlan",
        "masters": bond.split(","),
        **(extra or {}),
        "sysfsRoot": SYS,
        "rdma": {"required": True, **(rdma or {})},
        "dataDir": str(STATE / "data"),
        "runDir": str(STATE / "run"),
        "logFile": str(OUT / "plugin.log"),
        "logLevel": "debug",
    }
    if prev is not None:
        conf["prevResult"] = prev
    env = {
        "PATH": os.environ["PATH"],
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": f"e2e-{pod}",
        "CNI_NETNS": f"/run/netns/{pod}" if netns is None else netns,
        "CNI_IFNAME": ifname,
        "CNI_PATH": "/usr/lib/cni:/opt/cni/bin",
        "CNI_ARGS": f"IgnoreUnknown=true;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}",
    }
    if failpoint:
        env["RDMA_CNI_FAILPOINT"] = failpoint  # the plugin's test hook: kill -9 itself / fail at a step
    t0 = time.monotonic()
    proc = run(
        [sys.executable, "-m", "rdma_cni.cli.macvlan"],
        stdin=json.dumps(conf),
        env=env,
        timeout=180,
        ok=range(-64, 256),
    )
    seconds = round(time.monotonic() - t0, 2)
    try:
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        out = {"unparsable stdout": proc.stdout}
    R.fact(
        f"{command} {pod}",
        {"rc": proc.returncode, "seconds": seconds, "stdout": out, "stderr": proc.stderr[-2000:]},
    )
    return proc.returncode, out, proc.stderr


def status(bond: str, rdma: dict[str, Any] | None = None) -> tuple[int, dict[str, Any] | None]:
    """STATUS (CNI 1.1): could an ADD succeed now? Only the config and CNI_COMMAND/CNI_PATH."""
    conf = {
        "cniVersion": "1.1.0",
        "name": "rdma-e2e",
        "type": "rdma-macvlan",
        "masters": [bond],
        "sysfsRoot": SYS,
        "rdma": {"required": True, **(rdma or {})},
        "dataDir": str(STATE / "data"),
        "runDir": str(STATE / "run"),
        "logFile": str(OUT / "plugin.log"),
        "logLevel": "debug",
    }
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "STATUS", "CNI_PATH": "/usr/lib/cni:/opt/cni/bin"}
    proc = run(
        [sys.executable, "-m", "rdma_cni.cli.macvlan"],
        stdin=json.dumps(conf),
        env=env,
        timeout=180,
        ok=range(-64, 256),
    )
    out = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    R.fact(
        f"STATUS {bond} {rdma or ''}", {"rc": proc.returncode, "stdout": out, "stderr": proc.stderr[-1500:]}
    )
    return proc.returncode, out


def pod_view(pod: str, dev: str, ipv4: str, index: int | None) -> None:
    """What a user in the pod is told to put in NCCL_IB_GID_INDEX: ``cni-tool gids --netns``."""
    rows = pod_gid_rows(pod, dev)
    if rows is None:
        return
    found = [r.get("index") for r in rows if r.get("ipv4") == ipv4 and r.get("type") == "RoCE v2"]
    R.check(f"cni-tool gids inside {pod}: RoCE v2 index of {ipv4} equals the host's", [index], found, rows)


def pod_gid_rows(pod: str, dev: str | None = None) -> list[dict[str, Any]] | None:
    """``cni-tool gids --netns`` of ``pod`` (one device, or all): its JSON rows, None when it failed
    (recorded) or the checkout has no such command (skipped)."""
    if importlib.util.find_spec("rdma_cni.cli.tool_gids") is None:
        R.skip(f"cni-tool gids in {pod}", "rdma_cni/cli/tool_gids.py is not present")
        return None
    argv = [sys.executable, "-m", "rdma_cni.cli.tool", "gids", *([dev] if dev else [])]
    proc = run([*argv, "--netns", f"/run/netns/{pod}", "--json"], ok=range(-64, 256), timeout=120)
    try:
        rows = json.loads(proc.stdout)
    except json.JSONDecodeError:
        R.check(f"cni-tool gids --netns {pod} prints JSON", True, False, proc.stdout + proc.stderr)
        return None
    return rows if isinstance(rows, list) else rows.get("gids", []) if isinstance(rows, dict) else []


def result_ips(result: dict[str, Any] | None) -> list[str]:
    return sorted(i["address"] for i in (result or {}).get("ips", []))


def pod_ifname(result: dict[str, Any] | None, pod: str) -> str | None:
    for iface in (result or {}).get("interfaces", []):
        if iface.get("sandbox") == f"/run/netns/{pod}":
            return str(iface["name"])
    return None


def plugin_available() -> str | None:
    """Why the plugin section cannot run, or None."""
    if importlib.util.find_spec("rdma_cni.cli.macvlan") is None:
        return "rdma_cni/cli/macvlan.py (H2's rdma-macvlan entry point) is not in this checkout"
    return None


def plugin_rdma_missing() -> str | None:
    """Why the plugin cannot do its RDMA part yet (no GID record, no netns-mode check), or None.

    While the plugin is being built its address moves can already be checked here; what needs its
    RDMA path is skipped with this reason instead of failing for a reason everybody knows.
    """
    spec = importlib.util.find_spec("rdma_cni.plugins")
    folder = Path(next(iter(spec.submodule_search_locations or []))) if spec else None
    sources = sorted(folder.glob("macvlan/*.py")) if folder else []
    if not any(
        "rdma_cni.rdma" in f.read_text() or "from rdma_cni import rdma" in f.read_text() for f in sources
    ):
        return (
            "rdma-macvlan does not use rdma_cni.rdma yet (no import in rdma_cni/plugins/macvlan/*.py): "
            "it writes no GID record and checks no RDMA netns mode"
        )
    return None


def plugin_section() -> None:
    missing = plugin_available()
    if missing:
        R.skip("plugin", missing)
        return
    rdma_missing = plugin_rdma_missing()
    before = host_snapshot()
    host_idx = {a: v2_index(dev, a) for dev, _, addrs in (BONDS["bond0"], BONDS["bond1"]) for a in addrs}
    pingpong_host()

    rc, out = status("bond0")
    R.check("STATUS before any pod (shared mode, bond free): exit code", 0, rc, out)
    ip(["netns add pod1", "netns add pod2"])
    results: dict[str, dict[str, Any] | None] = {}
    for pod, bond in (("pod1", "bond0"), ("pod2", "bond1")):
        dev, _, addrs = BONDS[bond]
        rc, res, _ = cni("ADD", pod, bond)
        results[pod] = res
        R.check(f"ADD {pod} on {bond}: exit code", 0, rc)
        R.check(f"ADD {pod}: result lists the bond's addresses", sorted(addrs), result_ips(res))
        ifname = pod_ifname(res, pod)
        R.check(f"ADD {pod}: the pod interface is in the result", True, ifname is not None)
        R.check(f"ADD {pod}: {bond} left without IPv4 addresses", [], addresses(bond))
        if ifname:
            R.check(
                f"ADD {pod}: pod interface holds the addresses",
                list(addrs)[:1] + [a + " secondary" for a in addrs[1:]],
                addresses(ifname, pod),
            )
        for a in addrs:
            entry = v2_entry(dev, a)
            R.check(
                f"ADD {pod}: RoCE v2 GID index of {a} in the pod equals the host's",
                host_idx[a],
                entry and entry["index"],
            )
            R.check(f"ADD {pod}: GID of {a} belongs to the pod interface", ifname, entry and entry["ndev"])
        if rdma_missing:
            R.skip(f"ADD {pod}: GID record", rdma_missing)
        else:
            check_gid_record(pod, dev, addrs[0], host_idx[addrs[0]])
    R.fact("gid_tables_with_pods", tables())
    rc, out, _ = cni("CHECK", "pod1", "bond0", prev=results["pod1"])
    R.check("CHECK pod1 against the live system: exit code", 0, rc, out)
    pod_view("pod1", "mlx5_bond_0", "198.51.100.10", host_idx["198.51.100.10/24"])

    pingpong_pods(host_idx)

    # DEL with the pod alive; then again (idempotent)
    rc, _, _ = cni("DEL", "pod1", "bond0", prev=results["pod1"])
    R.check("DEL pod1: exit code", 0, rc)
    R.check(
        "DEL pod1: bond0 has its addresses back, primary first",
        ["198.51.100.10/24", "198.51.100.20/24 secondary"],
        addresses("bond0"),
    )
    for a in BONDS["bond0"][2]:
        R.check(f"DEL pod1: {a} back at the host's GID index", host_idx[a], v2_index("mlx5_bond_0", a))
    R.check("DEL pod1: only lo left in the pod", ["lo"], pod_links("pod1"))
    if not rdma_missing:
        R.check("DEL pod1: its GID record is removed", [], sorted(map(str, gid_records("pod1"))))
    rc, _, _ = cni("DEL", "pod1", "bond0", prev=results["pod1"])
    R.check("DEL pod1 again (idempotent): exit code", 0, rc)

    # DEL right after the runtime deleted the netns: the address left with it (the kernel drops the
    # pod's GID tens of ms later), the plugin's state still has it
    ip(["netns del pod2"])
    rc, _, _ = cni("DEL", "pod2", "bond1", prev=results["pod2"])
    R.check("DEL pod2 after its netns was deleted: exit code", 0, rc)
    R.check("DEL pod2: bond1 has its address back", ["198.51.100.11/24"], addresses("bond1"))
    R.check(
        "DEL pod2: 198.51.100.11 back at the host's GID index",
        host_idx["198.51.100.11/24"],
        v2_index("mlx5_bond_1", "198.51.100.11"),
    )
    if not rdma_missing:
        R.check("DEL pod2: its GID record is removed", [], sorted(map(str, gid_records("pod2"))))
    ip(["netns del pod1"])
    R.check("host as before the pods (links, addresses, GID tables)", before, host_snapshot())
    two_bonds_in_one_pod(host_idx, rdma_missing)
    R.check("host as before, after the two-bond pod", before, host_snapshot())


def two_bonds_in_one_pod(host_idx: dict[str, int | None], rdma_missing: str | None) -> None:
    """A training pod gets several bond NICs: both bonds' addresses and GIDs move, both come back.
    Its interfaces share a link group of their own, so DEL deletes them with one request (one RCU
    grace period); another plugin's interfaces in the pod (here a veth pair, one end in a group of
    its own) stay; every GID table on the host is as before the pod."""
    ip(["netns add pod4"])
    ip(["link add eth0 type veth peer name eth0p", "link set eth0p group 7"], netns="pod4")
    gids_before = tables()
    rc, res, _ = cni("ADD", "pod4", "bond0,bond1", extra={"count": 2})
    R.check("ADD pod4 with two bonds: exit code", 0, rc)
    names = sorted(
        i["name"] for i in (res or {}).get("interfaces", []) if i.get("sandbox") == "/run/netns/pod4"
    )
    R.check("ADD pod4: one pod interface per bond", ["bond0", "bond1"], names)
    for bond in ("bond0", "bond1"):
        dev, _, addrs = BONDS[bond]
        R.check(f"ADD pod4: {bond} left without IPv4 addresses", [], addresses(bond))
        for a in addrs:
            entry = v2_entry(dev, a)
            R.check(f"ADD pod4: {a} at the host's GID index on {dev}", host_idx[a], entry and entry["index"])
    rules = json.loads(run(["ip", "-n", "pod4", "-j", "-4", "rule", "show"]).stdout)
    R.fact("pod4 policy rules", rules)
    R.check(
        "ADD pod4: a 'from <ip>' rule per bond, so replies leave by the NIC they came in on",
        ["198.51.100.10", "198.51.100.11"],
        sorted({r["src"] for r in rules if r.get("src") in ("198.51.100.10", "198.51.100.11")}),
    )
    if not rdma_missing:
        records = [json.loads(p.read_text()) for p in gid_records("pod4")]
        R.check(
            "ADD pod4: a GID record per RDMA device",
            ["mlx5_bond_0", "mlx5_bond_1"],
            sorted(str(r.get("device")) for r in records),
            records,
        )
    groups = link_groups("pod4")
    R.fact("pod4 link groups", groups)
    mine = {groups.get("bond0"), groups.get("bond1")}
    R.check("ADD pod4: both pod interfaces in one link group of their own",
            [True, True], [len(mine) == 1, not mine & {0, 7, None}], groups)
    logged = (OUT / "plugin.log").read_text() if (OUT / "plugin.log").exists() else ""
    rc, _, _ = cni("DEL", "pod4", "bond0,bond1", extra={"count": 2}, prev=res)
    R.check("DEL pod4: exit code", 0, rc)
    R.check("DEL pod4: the other plugin's interfaces stay", {"eth0": 0, "eth0p": 7, "lo": 0},
            link_groups("pod4"))
    tail = (OUT / "plugin.log").read_text()[len(logged):] if (OUT / "plugin.log").exists() else ""
    group = next(iter(mine))
    R.check("DEL pod4: both pod interfaces deleted with one request by link group",
            [True, False], [f"deleted with one request (link group {group})" in tail,
                            "deleted one by one" in tail], tail[-1500:])
    ip(["netns del pod4"])
    for bond in ("bond0", "bond1"):
        dev, _, addrs = BONDS[bond]
        for a in addrs:
            R.check(f"DEL pod4: {a} back at the host's GID index", host_idx[a], v2_index(dev, a))
    R.check("DEL pod4 (deleted by link group): every GID table of every device as before the pod",
            gids_before, tables())


def link_groups(netns: str) -> dict[str, int]:
    """name -> link group of every link in the netns (``ip -j`` says "default" for group 0)."""
    out = json.loads(run(["ip", "-n", netns, "-j", "link", "show"]).stdout or "[]")
    return {link["ifname"]: 0 if link.get("group", "default") == "default" else int(link["group"])
            for link in out}


def gid_records(pod: str) -> list[Path]:
    return sorted((STATE / "run" / "gid" / f"e2e-{pod}").glob("*.json"))


def check_gid_record(pod: str, dev: str, addr: str, index: int | None) -> None:
    """The records other components read (DESIGN: ``runDir/gid/<containerID>/<ifname>.json``, and
    ``runDir/gid/host.json`` with the host's index per device)."""
    folder = STATE / "run" / "gid" / f"e2e-{pod}"
    records = []
    for path in gid_records(pod):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            R.check(f"ADD {pod}: GID record {path} readable", True, False, str(e))
    mine = [r for r in records if r.get("device") == dev]
    R.check(f"ADD {pod}: one GID record for {dev} under {folder}", 1, len(mine), records)
    if mine:
        R.check(
            f"ADD {pod}: GID record has the pod's index and GID",
            {"gidIndex": index, "port": 1, "ipv4": addr.split("/")[0]},
            {k: mine[0].get(k) for k in ("gidIndex", "port", "ipv4")},
            mine[0],
        )
    try:
        host = json.loads((STATE / "run" / "gid" / "host.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        R.check(f"ADD {pod}: host GID record readable", True, False, str(e))
        return
    ports = [p for p in host.get("ports", []) if isinstance(p, dict) and p.get("device") == dev]
    R.check(
        f"ADD {pod}: host.json keeps the host's index of {dev}",
        [index],
        [p.get("gidIndex") for p in ports],
        host,
    )


# ------------------------------------------------------------------ section: crash


def crash_section() -> None:
    """The plugin dies (kill -9) or fails at its most delicate moments, on real GID tables."""
    missing = plugin_available() or plugin_rdma_missing()
    if missing:
        R.skip("crash", missing)
        return
    before = host_snapshot()
    host_idx = {a: v2_index("mlx5_bond_0", a) for a in BONDS["bond0"][2]}
    for label, failpoint, delete_netns_first in (
        ("kill -9 with the addresses on neither side, then DEL", "addresses-removed", False),
        ("kill -9 with the addresses in the pod, netns deleted, then DEL", "addresses-added", True),
        ("I/O error after the GID check: ADD rolls back", "rdma-checked:error", False),
    ):
        ip(["netns add pod5"])
        rc, out, _ = cni("ADD", "pod5", "bond0", failpoint=failpoint)
        R.check(f"{label}: ADD did not succeed", True, rc != 0, out)
        if failpoint.endswith(":error"):
            R.check(f"{label}: error JSON with a code", True, isinstance((out or {}).get("code"), int), out)
            R.check(f"{label}: host restored by the failed ADD itself", before, host_snapshot())
        else:
            R.check(f"{label}: killed (-9)", -9, rc)
        if delete_netns_first:
            ip(["netns del pod5"])
        rc, _, _ = cni("DEL", "pod5", "bond0")
        R.check(f"{label}: DEL exit code", 0, rc)
        R.check(
            f"{label}: bond0 has its addresses back in order",
            ["198.51.100.10/24", "198.51.100.20/24 secondary"],
            addresses("bond0"),
        )
        for a, index in host_idx.items():
            R.check(f"{label}: {a} back at the host's GID index", index, v2_index("mlx5_bond_0", a))
        if not delete_netns_first:
            R.check(f"{label}: nothing left in the pod", ["lo"], pod_links("pod5"))
            ip(["netns del pod5"])
    # a node that lost its runtime's memory (crash, reboot): GC with no valid attachment heals it
    ip(["netns add pod6"])
    rc, _, _ = cni("ADD", "pod6", "bond0")
    R.check("GC: ADD pod6 exit code", 0, rc)
    ip(["netns del pod6"])
    R.check("GC: the pod's netns is gone and bond0 still lacks its addresses", [], addresses("bond0"))
    rc, out, _ = cni("GC", "pod6", "bond0", extra={"cni.dev/valid-attachments": []})
    R.check("GC with no valid attachments: exit code", 0, rc, out)
    for a, index in host_idx.items():
        R.check(f"GC: {a} back at the host's GID index", index, v2_index("mlx5_bond_0", a))
    R.check("host as before the crashes", before, host_snapshot())


# ------------------------------------------------------------------ section: shared (rdma-ipvlan)

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


# ------------------------------------------------------------------ section: reboot


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


def reboot_section() -> None:
    """A reboot-like step on real GID tables, in two plugin calls (each costs seconds under TCG):
    bond0 also holds an IPv6, a pod takes both (the pod's IPv6 GID must keep the host's index: the
    plugin checks it); its netns vanishes without DEL and the node's config gives bond0 a different
    IPv4 and IPv6 while the record still holds the old ones. DEL (CNI_NETNS empty, as containerd
    sends it) must keep what the bond holds now, with the new IPv4's GID at the unified index."""
    missing = plugin_available() or plugin_rdma_missing()
    if missing:
        R.skip("reboot", missing)
        return
    dev, old4, old6 = "mlx5_bond_0", list(BONDS["bond0"][2]), "2001:db8:10::10/64"
    new4, new6 = "198.51.100.40/24", "2001:db8:10::40/64"
    unified = v2_index(dev, old4[0])
    ip(["netns add pod7", f"addr add {old6} dev bond0 nodad"])
    wait_for(lambda: v2_index6(dev, old6) is not None, 5)
    host6 = v2_index6(dev, old6)
    R.check("the bond's IPv6 has a RoCE v2 GID (the address itself)", True, host6 is not None)
    rc, out, _ = cni("ADD", "pod7", "bond0")
    R.check("ADD pod7 (IPv4 + IPv6) exit code", 0, rc, out)
    R.check("pod7 got the bond's IPv4 and IPv6", sorted([*old4, old6]), result_ips(out))
    record = json.loads(gid_records("pod7")[0].read_text()) if gid_records("pod7") else {}
    R.check("pod7's GID record: the host's IPv4 and IPv6 indexes",
            {"gidIndex": unified, "gidIndexIPv6": host6},
            {k: record.get(k) for k in ("gidIndex", "gidIndexIPv6")}, record)
    ip(["netns del pod7"])
    gone = wait_for(lambda: all(v2_index(dev, a) is None for a in old4) and v2_index6(dev, old6) is None, 10)
    R.check("the pod's GIDs leave with its netns", True, gone is not None)
    ip([f"addr add {new4} dev bond0", f"addr add {new6} dev bond0 nodad"])  # the node's new config
    rc, out, _ = cni("DEL", "pod7", "bond0", netns="")
    R.check("DEL after the re-address: exit code", 0, rc, out)
    R.check("bond0 keeps only its new IPv4 and IPv6", [[new4], [new6]],
            [addresses("bond0"), addresses6("bond0")])
    R.check("none of the record's addresses came back (no GID)", [None] * (len(old4) + 1),
            [v2_index(dev, a) for a in old4] + [v2_index6(dev, old6)])
    idx4, idx6 = v2_index(dev, new4), v2_index6(dev, new6)
    R.fact("GID table after the skipped restore", gid_table(dev))
    R.check("the new IPv4's GID is at the unified index", unified, idx4)
    R.check("the new IPv6 has a RoCE v2 GID", True, idx6 is not None)
    host = json.loads((STATE / "run" / "gid" / "host.json").read_text())
    port = next((p for p in host.get("ports", []) if p.get("device") == dev), {})
    R.check("host.json follows what the bond holds",
            {"ipv4": new4.split("/")[0], "gidIndex": idx4, "present": True, "ipv6": new6.split("/")[0],
             "gidIndexIPv6": idx6},
            {k: port.get(k) for k in ("ipv4", "gidIndex", "present", "ipv6", "gidIndexIPv6")}, host)
    left = sorted(p.name for p in (STATE / "data" / "attachments").glob("*.json"))
    R.check("nothing pinned any more", [], left)
    ip([f"addr del {new6} dev bond0", f"addr del {new4} dev bond0",
        *[f"addr add {a} dev bond0" for a in old4]])  # the node as the next section expects it


# ------------------------------------------------------------------ section: dualstack


def dualstack_section() -> None:
    """A bond whose IPv6 appeared before its IPv4 (at boot, say): the IPv6 GID has the lower index.
    The pod's addresses must go in in the order of the host's GID indexes, so both families keep
    their host indexes in the pod (ADD checks each) and again when DEL gives them back."""
    missing = plugin_available() or plugin_rdma_missing()
    if missing:
        R.skip("dualstack", missing)
        return
    dev, (v4,), v6 = "mlx5_bond_1", BONDS["bond1"][2], "2001:db8:11::11/64"
    before = host_snapshot()
    ip([f"addr del {v4} dev bond1", f"addr add {v6} dev bond1 nodad"])
    wait_for(lambda: v2_index6(dev, v6) is not None, 5)
    ip([f"addr add {v4} dev bond1"])
    wait_for(lambda: v2_index(dev, v4) is not None, 5)

    def indexes() -> dict[str, int | None]:
        return {"gidIndex": v2_index(dev, v4), "gidIndexIPv6": v2_index6(dev, v6)}

    host = indexes()
    R.fact("dual-stack bond1, IPv6 first: GID table", gid_table(dev))
    h4, h6 = host["gidIndex"], host["gidIndexIPv6"]
    R.check("the IPv6 appeared first: its GID has the lower index", True,
            h4 is not None and h6 is not None and h6 < h4, host)
    ip(["netns add pod8"])
    try:
        rc, out, _ = cni("ADD", "pod8", "bond1")
        R.check("ADD pod8 (IPv6 before IPv4 on the host) exit code", 0, rc, out)
        record = json.loads(gid_records("pod8")[0].read_text()) if gid_records("pod8") else {}
        R.check("pod8's GID record: both families at the host's indexes", host,
                {k: record.get(k) for k in host}, record)
        R.check("pod8's GIDs at the host's indexes", host, indexes(), gid_table(dev))
        rc, out, _ = cni("DEL", "pod8", "bond1")
        R.check("DEL pod8 exit code", 0, rc, out)
        back = wait_for(lambda: indexes() == host, 5)
        R.check("after DEL both families are back at the host's indexes", host, indexes(), {"seconds": back})
        R.check("bond1 holds its IPv4 and IPv6 again", [[v4], [v6]],
                [addresses("bond1"), addresses6("bond1")])
    finally:
        ip(["netns del pod8"])
        ip([f"addr del {v6} dev bond1", f"addr del {v4} dev bond1", f"addr add {v4} dev bond1"])
        wait_for(lambda: v2_index(dev, v4) is not None, 5)
    R.check("host as before the section", before, host_snapshot())


# ------------------------------------------------------------------ RDMA traffic


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


# ------------------------------------------------------------------ section: exclusive


def set_netns_mode(mode: str) -> None:
    """Only possible while no other netns exists; a deleted netns lingers briefly, hence the retry."""
    retry(lambda: run(["rdma", "system", "set", "netns", mode]), 10)


def exclusive_section() -> None:
    missing = plugin_available() or plugin_rdma_missing()
    if missing:
        R.skip("exclusive", missing)
        return
    set_netns_mode("exclusive")
    R.fact("netns_mode after 'rdma system set netns exclusive'", netns_mode())
    ip(["netns add pod3"])
    try:
        rc, out = status("bond0")
        R.check(
            "STATUS, config shared, kernel exclusive: code 50 (plugin not available)",
            50,
            (out or {}).get("code"),
            out,
        )
        R.check("STATUS, config shared, kernel exclusive: non-zero exit", True, rc != 0)
        before = host_snapshot()
        r = run(["rdma", "dev", "set", "mlx5_bond_0", "netns", "pod3"], ok=range(-64, 256))
        R.fact(
            "rxe moved to a netns by hand (exclusive mode)", {"rc": r.returncode, "stderr": r.stderr.strip()}
        )
        for label, rdma, must_say in (
            ("config shared, kernel exclusive", {"netnsMode": "shared"}, "rdma system set netns shared"),
            ("config exclusive, rxe cannot move", {"netnsMode": "exclusive"}, "mlx5_bond_0"),
        ):
            rc, out, _ = cni("ADD", "pod3", "bond0", rdma=rdma)
            msg = (out or {}).get("msg", "") + " " + str((out or {}).get("details", ""))
            R.check(f"exclusive mode, {label}: ADD fails", True, rc != 0, out)
            R.check(
                f"exclusive mode, {label}: error JSON has a code",
                True,
                isinstance((out or {}).get("code"), int),
            )
            R.check(f"exclusive mode, {label}: the message says {must_say!r}", True, must_say in msg, msg)
            R.check(f"exclusive mode, {label}: host unchanged", before, host_snapshot())
            R.check(f"exclusive mode, {label}: nothing left in the pod", ["lo"], pod_links("pod3"))
            rc, _, _ = cni("DEL", "pod3", "bond0", rdma=rdma)
            R.check(f"exclusive mode, {label}: DEL after the failed ADD succeeds", 0, rc)
            R.check(f"exclusive mode, {label}: host unchanged after DEL", before, host_snapshot())
    finally:
        ip(["netns del pod3"])
        set_netns_mode("shared")


# ------------------------------------------------------------------ main


def main() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    build_ok = True
    # VM_E2E_SECTIONS=setup,shared: only those sections, for a quicker look at one part
    wanted = [n for n in os.environ.get("VM_E2E_SECTIONS", "").split(",") if n]
    for name, section in (
        ("setup", build_node),
        ("kernel", kernel_section),
        ("plugin", plugin_section),
        ("crash", crash_section),
        ("shared", shared_section),
        ("reboot", reboot_section),
        ("dualstack", dualstack_section),
        ("exclusive", exclusive_section),
    ):
        R.section = name
        if not build_ok:
            R.skip(name, "the node layout could not be built")
            continue
        if wanted and name not in wanted:
            R.skip(name, f"not in VM_E2E_SECTIONS={','.join(wanted)}")
            continue
        t0 = time.monotonic()
        try:
            section()
        except Exception as e:  # noqa: BLE001 - a crashed section is reported, the next one still runs
            R.check("section ran to the end", None, f"{type(e).__name__}: {e}", traceback.format_exc())
            build_ok = name != "setup"
        R.fact("section seconds", round(time.monotonic() - t0, 1))
    R.section = "summary"
    R.fact("checks failed", R.failed)
    return 1 if R.failed else 0


if __name__ == "__main__":
    sys.exit(main())
