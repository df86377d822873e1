"""Section ``plugin``: the real ``rdma-macvlan`` for two pods on two bonds: GID index in the pod equals
the host's, RDMA traffic between the pods, DEL with the netns alive and already deleted, a secondary
address, idempotent DEL, two bonds in one pod."""

from __future__ import annotations

import json
from typing import Any

from .cni import (
    cni,
    gid_records,
    plugin_available,
    plugin_rdma_missing,
    pod_ifname,
    pod_view,
    result_ips,
    status,
)
from .host import addresses, host_snapshot, ip, pod_links, run, tables, v2_entry, v2_index
from .rdma_traffic import pingpong_host, pingpong_pods
from .report import BONDS, OUT, STATE, R


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
