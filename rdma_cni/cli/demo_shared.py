"""``scripts/demo --mode shared``: TKE's shared RDMA NIC mode on the demo's simulated GPU node: the
device plugin's shared pool, two pods sharing every bond through rdma-ipvlan, and the node as it was.

The node is the exclusive demo's (:class:`rdma_cni.cli.demo.Demo`: veth bonds with /28s in a node
netns, their peers in a switch netns, the simulated RDMA sysfs whose GID tables follow the live
addresses, mknod'd ``/dev/infiniband`` nodes); what differs is a node in shared mode:

* rdma-ipvlan's delegate config (``conf/shared-mode``) instead of rdma-macvlan's, with ``link:
  macvlan``: this kernel has no IPVLAN (the VM test runs the ``ipvlan`` default);
* rdma-device-plugin started with ``mode: shared``: ``sharedCount`` (1000) virtual devices of
  ``tke-shared-rdma``; kubelet admits two pods asking for one each, and each Allocate mounts every
  RDMA device (no GID-index env: a shared-mode pod's index exists only after its ADD);
* the two pods ADDed through rdma-multus (``tke-route-eni,tke-rdma-ipvlan``): each gets a child of
  every bond with an address of its own from the bond's /28 and that address's own RoCE v2 GID index;
  pings to the switch on every bond and between the pods; ``cni-tool state`` and ``doctor``;
* both DELeted, and the node compared with how it started, GID tables included.

Names, cleanup on failure and Ctrl-C, and the sweep of killed runs are the exclusive demo's.
"""

from __future__ import annotations

import ipaddress
import json
import signal
import sys
import time
import uuid
from functools import partial
from typing import Any

from rdma_cni.cli import demo
from rdma_cni.cli.demo import ANNOTATION, PING, REPO, RESOURCE, DemoFailed, banner, run, say

SHARED_COUNT = 1000
NETWORK = "tke-rdma-ipvlan"
PODS = 2
GID_ENV = ("NCCL_IB_GID_INDEX", "UCX_IB_GID_INDEX")


class SharedDemo(demo.Demo):
    """The exclusive demo's node with shared mode's configs, device plugin and two pods."""

    def __init__(self, bonds: int, bundle: str, mode: str = "vpc-cni") -> None:
        super().__init__(bonds, bonds, bundle, mode)
        self.pods = [f"{self.pods_prefix}{i}" for i in range(PODS)]
        self.pod_names = [f"rdma-demo-{i}" for i in range(PODS)]
        self.pod_uids = [str(uuid.uuid4()) for _ in range(PODS)]
        self.delegate = self.conf_dir / "rdma-multus.d" / f"{NETWORK}.conf"
        self.data_dir = self.tmp / "ipvlan-state"

    @property
    def networks(self) -> str:
        return f"{self.default_network},{NETWORK}"

    def device_plugin_config(self) -> list[str]:
        path = self.tmp / "rdma-device-plugin.yaml"
        path.write_text(f"mode: shared\nsharedCount: {SHARED_COUNT}\n")
        return ["--config", str(path), "--cni-conf", str(self.delegate)]

    def install_plugins(self) -> None:
        super().install_plugins()
        if not self.bundle:  # the bundle's install.sh links rdma-ipvlan itself
            path = self.bin_dir / "rdma-ipvlan"
            path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rdma_cni.cli.ipvlan "$@"\n')
            path.chmod(0o755)

    def write_configs(self) -> None:
        """The exclusive demo's configs with rdma-ipvlan's delegate in place of rdma-macvlan's (a
        node runs one mode); only paths and the link type differ from conf/shared-mode."""
        super().write_configs()
        (self.conf_dir / "rdma-multus.d" / "tke-rdma-macvlan.conf").unlink()
        conf = json.loads((REPO / "conf" / "shared-mode" / "rdma-multus.d" / f"{NETWORK}.conf").read_text())
        conf.update(
            link="macvlan",
            # The switch's own addresses: the demo's bonds route nothing through them (a gateway of a
            # bond's route the plugin would skip by itself), so the operator names them.
            exclude=[demo.bond_addr(i)[1].split("/")[0] for i in range(len(self.bonds))],
            dataDir=str(self.data_dir),
            runDir=str(self.tmp / "run"),
            sysfsRoot=self.sysfs,
            logFile=str(self.tmp / "log" / "rdma-cni.log"),
        )
        self.delegate.write_text(json.dumps(conf, indent=2))

    def admit_pods(self, held: list[list[str]]) -> None:
        """What kubelet's PodResources API answers once it admitted the pods: each pod's virtual
        devices of the shared pool; rdma-multus asks it at ADD, as on a real node (no checkpoint)."""
        self.pod_resources.set_allocatable(RESOURCE, {str(i): None for i in range(SHARED_COUNT)})
        for name, ids in zip(self.pod_names, held, strict=True):
            self.pod_resources.set_pod(demo.POD["namespace"], name, {"main": {RESOURCE: ids}})

    def bond_snapshot(self) -> dict[str, Any]:
        """The node's snapshot as far as the bonds go: their addresses and routes, and the rules (the
        cluster network's veths and /32 routes come and go with the pods, as on any node)."""
        snap = self.host_snapshot()
        return {
            "addr": [a for a in snap["addr"] if a["ifname"] in self.bonds],
            "route": [r for r in snap["route"] if r.get("dev") in self.bonds],
            "rule": snap["rule"],
        }

    def pod_env(self, i: int) -> dict[str, str]:
        env = self.tool_env(self.pod_uids[i])
        name = f"K8S_POD_NAME={demo.POD['name']};"
        env["CNI_ARGS"] = env["CNI_ARGS"].replace(name, f"K8S_POD_NAME={self.pod_names[i]};")
        return env

    def pod_pings(self, i: int, targets: list[tuple[str, str]]) -> list[float]:
        """One ICMP echo per (interface, destination) from pod i: the exclusive demo's probe, run for
        each target in one process (a process per ping is most of the step's time)."""
        codes = [PING.replace("DST", dst).replace("IFACE", iface) for iface, dst in targets]
        driver = (
            f"for code in {codes!r}:\n"
            "    try:\n        exec(code, {})\n"
            "    except SystemExit as end:\n        print('lost', flush=True) if end.code else None\n"
        )
        proc = run("ip", "netns", "exec", self.pods[i], sys.executable, "-c", driver, check=False)
        replies = proc.stdout.split()
        replies += ["lost"] * (len(targets) - len(replies))  # the probe itself failed: the rest too
        lost = [
            f"{dst} from {iface}" for (iface, dst), r in zip(targets, replies, strict=True) if r == "lost"
        ]
        if lost:
            raise DemoFailed(f"{self.pod_names[i]}: no reply to ping {', '.join(lost)} {proc.stderr.strip()}")
        return [float(r) for r in replies]

    def pod_addresses(self, i: int) -> dict[str, str]:
        """Bond interface of pod i -> its IPv4 address."""
        links = json.loads(run("ip", "-n", self.pods[i], "-4", "-j", "addr").stdout or "[]")
        got = {a["ifname"]: a["addr_info"][0]["local"] for a in links if a.get("addr_info")}
        return {b: got[b] for b in self.bonds if b in got}

    def container_id(self, i: int) -> str:
        from rdma_cni.cli.tool import container_id_for

        return container_id_for(f"/run/netns/{self.pods[i]}")

    def gid_table(self) -> list[dict[str, Any]]:
        from rdma_cni.cli.tool_gids import collect

        return collect(self.sysfs, None)


def step_shared_pool(d: SharedDemo, ep: Any) -> list[list[str]]:
    """What kubelet sees of the shared pool and what each pod's Allocate gives; the pods' device IDs."""

    def ready(devs: list[Any]) -> bool:
        return len(devs) == SHARED_COUNT and all(x.health == "Healthy" for x in devs)

    try:
        _, devs = ep.wait_list(ready, 30)
    except AssertionError as exc:
        raise DemoFailed(
            f"the shared pool never listed {SHARED_COUNT} healthy devices ({exc})"[:2000]
        ) from None
    healthy = sum(1 for x in devs if x.health == "Healthy")
    numa = sorted({n for x in devs for n in x.numa})
    say(f"kubelet: registered {RESOURCE} from {ep.endpoint} (mode: shared, sharedCount {SHARED_COUNT})")
    say(f"-> node capacity {RESOURCE}: {len(devs)}, allocatable: {healthy}")
    say(
        f'   virtual devices "{devs[0].id}".."{devs[-1].id}", all Healthy (while any RDMA device is usable), '
        f"each on NUMA nodes {','.join(map(str, numa))} (every HCA of the pool)"
    )
    held: list[list[str]] = []
    first: Any = None
    for name in d.pod_names:
        taken = {x for ids in held for x in ids}
        picks = ep.preferred([x.id for x in devs if x.id not in taken], [], 1)
        resp = ep.allocate(picks).container_responses[0]
        say(f"kubelet admits pod {name} asking for 1: GetPreferredAllocation -> {_ids(picks)}; Allocate ->")
        _check_allocation(d, name, resp)
        if first is None:
            for spec in resp.devices:
                say(f"   {spec.container_path:<26} <- {spec.host_path} ({spec.permissions})")
            for key in sorted(resp.envs):
                say(f"   {key}={resp.envs[key]}")
            first = resp
        elif (list(resp.devices), dict(resp.envs)) == (list(first.devices), dict(first.envs)):
            say(
                f"   the same {len(resp.devices)} device nodes and env as {d.pod_names[0]}'s: "
                "every RDMA device"
            )
        else:
            raise DemoFailed(f"{name}'s Allocate differs from {d.pod_names[0]}'s in a shared pool: {resp}")
        held.append(picks)
    say(f"-> no {' / '.join(GID_ENV)}: a shared-mode pod's own GID index exists only after its CNI ADD")
    return held


def _ids(ids: list[str]) -> str:
    """Virtual device IDs quoted: "0" is an ID, not a count."""
    return ", ".join(f'"{i}"' for i in ids)


def _check_allocation(d: SharedDemo, pod: str, resp: Any) -> None:
    """A shared pool mounts every RDMA device (uverbs, umad, issm; rdma_cm once) and names no GID index."""
    paths = {spec.container_path for spec in resp.devices}
    kinds = ("uverbs", "umad", "issm")
    wanted = {f"/dev/infiniband/{kind}{i}" for kind in kinds for i in range(len(d.bonds))} | {
        "/dev/infiniband/rdma_cm"
    }
    hcas = ",".join(f"mlx5_bond_{i}" for i in range(len(d.bonds)))
    if paths != wanted:
        raise DemoFailed(f"{pod}'s Allocate mounts {sorted(paths)}, not every RDMA device {sorted(wanted)}")
    if resp.envs.get("NCCL_IB_HCA") != f"={hcas}" or any(k in resp.envs for k in GID_ENV):
        raise DemoFailed(
            f"{pod}'s Allocate env is {dict(resp.envs)}: want NCCL_IB_HCA=={hcas} and no GID index"
        )


def step_add(d: SharedDemo, held: list[list[str]]) -> None:
    banner(f"3. Two pods, each {ANNOTATION}: {d.networks}; {RESOURCE}: 1")
    d.admit_pods(held)
    asked = len(d.pod_resources.calls)
    say(
        "kubelet PodResources: "
        + ", ".join(f"{name} holds device {_ids(ids)}" for name, ids in zip(d.pod_names, held, strict=True))
    )
    from rdma_cni.sim.node import wait_watched

    for i, pod in enumerate(d.pods):
        d.netns(pod)
        try:  # the simulated RDMA node must follow the pod netns before its addresses appear
            wait_watched(f"/run/netns/{d.node}", f"/run/netns/{pod}")
        except TimeoutError as exc:
            raise DemoFailed(str(exc)) from None
        say(f"$ cni-tool add rdma-multus /run/netns/{pod}    (pod {d.pod_names[i]}; its result, in short:)")
        proc = d.cni_tool("add", "rdma-multus", f"/run/netns/{pod}", env=d.pod_env(i), show=False)
        result = json.loads(proc.stdout)
        names = [x["name"] for x in result["interfaces"]]
        say("-> " + ", ".join(f"{names[ip['interface']]} {ip['address']}" for ip in result["ips"]))
    calls = d.pod_resources.calls[asked:]
    if not calls:
        raise DemoFailed("rdma-multus did not ask kubelet's PodResources API which devices the pods hold")
    say(f"-> rdma-multus asked kubelet's PodResources API ({', '.join(dict.fromkeys(calls))}) "
        "which devices each pod holds")


def step_pod_view(d: SharedDemo, bonds_before: dict[str, Any], host_index: int) -> list[dict[str, str]]:
    banner("4. Inside the pods: a child of every bond in each, each with an address of its own")
    say(f"(link: macvlan, a MAC per pod: this kernel has no IPVLAN; {NETWORK}'s default is ipvlan, as TKE's)")
    addrs = [d.pod_addresses(i) for i in range(PODS)]
    for i, pod in enumerate(d.pods):
        say()
        say(f"pod {d.pod_names[i]}:")
        run("ip", "-n", pod, "-br", "addr", show=True)
        run("ip", "-n", pod, "rule", show=True)
        for table in _bond_tables(pod):
            run("ip", "-n", pod, "route", "show", "table", table, show=True)
    _check_distinct(d, addrs)
    say()
    say("The node meanwhile: every bond keeps its own address, routes and rules (compared: unchanged)")
    run("ip", "-n", d.node, "-br", "addr", show=True)
    if d.bond_snapshot() != bonds_before:
        raise DemoFailed(
            "the bonds' addresses, routes or rules changed while the pods run (shared mode keeps them)"
        )
    for i, addr in enumerate(addrs):
        for b, ip in addr.items():
            d.wait_for(f"{d.pod_names[i]}'s GID on {b}", partial(_has_gid, d, b, ip))
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    step_gid_indexes(d, addrs, host_index)
    return addrs


def _bond_tables(pod: str) -> list[str]:
    """The routing tables the pod's ``from <address>`` rules point at (one per bond)."""
    rules = json.loads(run("ip", "-n", pod, "-j", "rule").stdout or "[]")
    own = [r for r in rules if r.get("src") and r.get("table") not in ("local", "main", "default")]
    return [str(r["table"]) for r in own]


def _check_distinct(d: SharedDemo, addrs: list[dict[str, str]]) -> None:
    for i, bond in enumerate(d.bonds):
        got = [a.get(bond) for a in addrs]
        if None in got or len(set(got)) != len(got) or demo.bond_ip(i) in got:
            raise DemoFailed(
                f"{bond}: the pods' addresses {got} are not each their own (bond: {demo.bond_ip(i)})"
            )
        subnet = ipaddress.ip_interface(demo.bond_addr(i)[0]).network
        if not all(ipaddress.ip_address(a) in subnet for a in got if a):
            raise DemoFailed(f"{bond}: the pods' addresses {got} are not all in its subnet {subnet}")
    say()
    for i, bond in enumerate(d.bonds):
        owners = ", ".join(f"{d.pod_names[p]} {a[bond]}" for p, a in enumerate(addrs))
        subnet = ipaddress.ip_interface(demo.bond_addr(i)[0]).network
        say(f"-> {bond} ({subnet}): the node {demo.bond_ip(i)}, {owners}")


def _has_gid(d: SharedDemo, bond: str, ip: str) -> bool:
    from rdma_cni.rdma import sysfs

    return sysfs.roce_v2_index(d.sysfs, _hca(d, bond), 1, ip) is not None


def _hca(d: SharedDemo, bond: str) -> str:
    return f"mlx5_bond_{d.bonds.index(bond)}"


def step_gid_indexes(d: SharedDemo, addrs: list[dict[str, str]], host_index: int) -> None:
    """Each pod address's own RoCE v2 GID index: rdma-ipvlan's record, the table's, and the
    network-status device-info rdma-multus builds from that record."""
    from rdma_cni.plugins.multus.status import rdma_device_info
    from rdma_cni.rdma import records, sysfs

    delegate = d.delegate.read_bytes()
    run_dir = str(d.tmp / "run")
    indexes: dict[str, list[int]] = {}
    for i, addr in enumerate(addrs):
        cid = d.container_id(i)
        info = rdma_device_info(delegate, cid)
        for bond, ip in addr.items():
            rec = records.read_pod_record(run_dir, cid, bond) or {}
            index = rec.get("gidIndex")
            table = sysfs.roce_v2_index(d.sysfs, _hca(d, bond), 1, ip)
            if not isinstance(index, int) or index != table or rec.get("mode") != "shared":
                raise DemoFailed(f"{d.pod_names[i]} {bond}: GID record {rec}, the table says index {table}")
            rdma = (info(bond) or {}).get("rdma", {})
            if rdma.get("gid-index") != index:
                raise DemoFailed(
                    f"{d.pod_names[i]} {bond}: network-status device-info {rdma}, not index {index}"
                )
            indexes.setdefault(bond, []).append(index)
            say(
                f"-> pod {d.pod_names[i]} {bond}: RoCE v2 GID of {ip} at index {index} "
                f'(device-info "rdma": {json.dumps(rdma)})'
            )
    for i, bond in enumerate(d.bonds):
        got = indexes.get(bond, [])
        if len(set(got)) != PODS or host_index in got or demo.gid_index(d, i) != host_index:
            raise DemoFailed(
                f"{bond}: the pods' GID indexes {got} are not each their own (host: {host_index})"
            )
    say(
        f"-> each pod address has a GID index of its own (the node's stays {host_index}): rdma-multus "
        "puts it in the pod's k8s.v1.cni.cncf.io/network-status device-info (rdma.gid-index) when it "
        "has a kubeconfig "
        "(here, without an API server, built by the same code from rdma-ipvlan's GID records); "
        "NCCL >= 2.21 finds it by itself"
    )


def step_traffic(d: SharedDemo, addrs: list[dict[str, str]]) -> None:
    banner("5. Traffic: each pod pings the switch on every bond, and the other pod")
    for i, addr in enumerate(addrs):
        other = addrs[1 - i]
        switch = [(b, demo.bond_addr(d.bonds.index(b))[1].split("/")[0]) for b in addr]
        replies = d.pod_pings(i, switch + [(b, other[b]) for b in addr])
        for (b, dst), ms in zip(switch, replies, strict=False):
            say(f"pod {d.pod_names[i]} {b} {addr[b]} -> switch {dst}: reply in {ms} ms")
        for b, ms in zip(addr, replies[len(switch) :], strict=True):
            peer = f"pod {d.pod_names[1 - i]} {other[b]}"
            say(f"pod {d.pod_names[i]} {b} {addr[b]} -> {peer}: reply in {ms} ms")


def step_delete(d: SharedDemo, before: dict[str, Any], gids: list[dict[str, Any]], host_index: int) -> None:
    banner("7. Delete both pods: their children, addresses and GIDs go; the node is as it was")
    for i, pod in enumerate(d.pods):
        d.cni_tool("del", "rdma-multus", f"/run/netns/{pod}", env=d.pod_env(i))
        run("ip", "netns", "del", pod)
        d.namespaces.remove(pod)
    d.wait_for("the pods' GIDs to go", lambda: d.gid_table() == gids)
    run("ip", "-n", d.node, "-br", "addr", show=True)
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    after = d.host_snapshot()
    if after != before:
        diff = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        raise DemoFailed(f"the node is not as it was: {json.dumps(diff)[:2000]}")
    left = sorted((d.data_dir / "attachments").glob("*.json"))
    if left:
        raise DemoFailed(f"addresses still held after both DELs: {[p.name for p in left]}")
    say(
        "-> node restored: addresses, routes, rules and GID tables as before the pods "
        f"(GID index {host_index}); no address held"
    )


def scenario(d: SharedDemo) -> None:
    banner(
        f"1. A simulated GPU node, shared mode: netns {d.node}, {len(d.bonds)} bond NICs, switch {d.switch}"
    )
    d.build_node()
    d.wait_for("the bonds' carrier", d.bonds_settled)
    with d.rdma():
        host_index = demo.step_node(d)
        before, bonds_before, gids = d.host_snapshot(), d.bond_snapshot(), d.gid_table()
        banner(f"2. The device plugin, mode: shared: one shared pool {RESOURCE} of {SHARED_COUNT}")
        with d.device_plugin() as ep:
            held = step_shared_pool(d, ep)
            step_add(d, held)
            addrs = step_pod_view(d, bonds_before, host_index)
            step_traffic(d, addrs)
            banner("6. What the node says: cni-tool state and cni-tool doctor")
            # runDir (GID records, the device plugin's status) is named by rdma-macvlan's config,
            # which a shared-mode node does not have: say where it is
            options = [*d.node_options(), "--run-dir", str(d.tmp / "run")]
            d.cni_tool("state", *options, check=False)
            d.cni_tool("doctor", *options, check=False)
            step_delete(d, before, gids, host_index)


def run_demo(bonds: int, bundle: str, mode: str) -> int:
    """The shared-mode demo with the exclusive demo's exit codes: 0, 1 failed, 130 interrupted."""
    d = SharedDemo(bonds, bundle, mode)
    signal.signal(signal.SIGTERM, demo.interrupted)
    started = time.monotonic()
    try:
        scenario(d)
    except DemoFailed as exc:
        say(f"\ndemo FAILED: {exc}")
        demo.show_logs(d)
        return 1
    except KeyboardInterrupt:
        say("\ndemo interrupted")
        return 130
    finally:
        d.cleanup()
        say(f"\ncleaned up: removed {d.tag}-* namespaces and {d.tmp}")
    say(f"demo OK in {time.monotonic() - started:.1f} s")
    return 0
