"""A pod's bond given back after a "reboot": the node re-adds the same addresses, re-addresses the
bond, or adds nothing — through each path that gives bonds back (DEL with an empty netns, DEL with a
stale netns path, GC, the agent's reconcile at start), for an IPv4 bond and a dual-stack one.

The "reboot" is what a real one leaves: the pod netns is gone (its interface with it), the node's
own routing config (the routes and rules it had configured) is gone, and the node's network config
then runs. The bond's present configuration is the truth: re-addressed, nothing of the record comes
back and the next pod gets exactly the new address; otherwise the record restores the node exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from netns import REPO, Node, launch_agent, sh, stop_agent

pytestmark = pytest.mark.netns

V4 = ["198.51.100.2/28 brd +", "198.51.100.3/28"]
V6 = ["2001:db8:1::2/64", "2001:db8:1::3/64 valid_lft 3000 preferred_lft 2000"]
NEW_V4 = "198.51.100.9/28"
NEW_V6 = "2001:db8:1::9/64"


def node_config(n: Node, family: str, variant: str) -> None:
    """What the node's network config does (at first boot, and again at the "reboot")."""
    if variant == "readdress":
        n.ip("addr", "add", NEW_V4, "dev", "bond0")
        if family == "dual":
            n.ip("addr", "add", NEW_V6, "dev", "bond0")
        n.ip("route", "add", "203.0.113.64/26", "via", "198.51.100.1")
        return
    if variant == "nothing":
        return
    for cidr in V4 + (V6 if family == "dual" else []):
        n.ip("addr", "add", *cidr.split(), "dev", "bond0")
    n.ip("route", "add", "203.0.113.0/28", "via", "198.51.100.1", "metric", "50")
    n.ip("route", "add", "default", "via", "198.51.100.1", "table", "10")
    n.ip("rule", "add", "from", "198.51.100.2", "lookup", "10", "pref", "1000")
    if family == "dual":
        n.ip("-6", "route", "add", "2001:db8:100::/48", "via", "2001:db8:1::1", "metric", "50")
        n.ip("-6", "rule", "add", "from", "2001:db8:1::2", "lookup", "10", "pref", "1000")


def reboot(n: Node, pod: Any, family: str) -> None:
    """The pod netns goes, and with the node's own config its routes and rules go too."""
    n.delete_pod(pod)
    n.ip("rule", "del", "from", "198.51.100.2", "lookup", "10", "pref", "1000", check=False)
    if family == "dual":
        n.ip("-6", "rule", "del", "from", "2001:db8:1::2", "lookup", "10", "pref", "1000", check=False)
        n.ip("-6", "route", "del", "2001:db8:100::/48", "via", "2001:db8:1::1", check=False)


def give_back(n: Node, path: str, conf: dict[str, Any], pod: Any) -> str:
    """Give the bond back by one path; returns the log that must say what was done."""
    if path == "del-empty-netns":
        res = n.plugin("DEL", conf, "")
    elif path == "del-stale-netns":
        res = n.plugin("DEL", conf, pod)
    elif path == "gc":
        res = n.plugin("GC", dict(conf, cniVersion="1.1.0", **{"cni.dev/valid-attachments": []}))
    else:
        return reconcile_at_start(n, conf)
    assert res.code == 0, res.stdout + res.stderr
    return os.path.join(n.tmp, "plugin.log")


def reconcile_at_start(n: Node, conf: dict[str, Any]) -> str:
    conf_file = os.path.join(n.tmp, "net.conf")
    with open(conf_file, "w") as f:
        json.dump(conf, f)
    sock, log = os.path.join(n.tmp, "agent.sock"), os.path.join(n.tmp, "agent.log")
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = launch_agent(sock, log, "--conf", conf_file, "--cni-path", "/usr/lib/cni", "--prefork", "1",
                        "--reconcile-interval", "0", netns=n.name, env=env)
    try:
        deadline = time.monotonic() + 60
        while n.state_files() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert n.state_files() == [], open(log).read()[-2000:]
    finally:
        stop_agent(proc)
    return os.path.join(n.tmp, "plugin.log")


def bond_addrs(n: Node, family: str = "") -> list[str]:
    link = next(x for x in n.node_json("addr") if x["ifname"] == "bond0")
    return [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"]
            if a.get("scope") != "link" and (not family or a["family"] == family)]


def without_lifetimes(snap: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with the ticking lifetimes replaced by whether they are forever."""
    out = json.loads(json.dumps(snap))
    for link in out["addr"]:
        for a in link["addr_info"]:
            for key in ("valid_life_time", "preferred_life_time"):
                a[key] = a[key] == 4294967295
    return out


def lifetimes(snap: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {f"{a['local']}/{a['prefixlen']}": (a["valid_life_time"], a["preferred_life_time"])
            for link in snap["addr"] for a in link["addr_info"] if a["valid_life_time"] != 4294967295}


def assert_same_node(before: dict[str, Any], after: dict[str, Any], elapsed: float,
                     then: dict[str, tuple[int, int]] | None = None) -> None:
    """``after`` equals ``before``, the finite lifetimes (``then``, default: ``before``'s) less
    ``elapsed`` seconds (whole seconds on both sides: a little slack)."""
    assert without_lifetimes(after) == without_lifetimes(before)
    then, now = then or lifetimes(before), lifetimes(after)
    assert then.keys() == now.keys()
    for cidr, (valid, preferred) in then.items():
        assert valid - elapsed - 3 <= now[cidr][0] <= valid - elapsed + 3, (cidr, then, now, elapsed)
        assert preferred - elapsed - 3 <= now[cidr][1] <= preferred - elapsed + 3, (cidr, then, now)


def cni_tool(n: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", n.name, sys.executable, "-m", "rdma_cni.cli.tool", *args,
         "--data-dir", n.data_dir, "--run-dir", n.run_dir, "--sysfs-root", os.path.join(n.tmp, "nosys")],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=60, check=False)


PATHS = ["del-empty-netns", "del-stale-netns", "gc", "reconcile"]


@pytest.mark.parametrize("family", ["v4", "dual"])
@pytest.mark.parametrize("variant", ["same", "readdress", "nothing"])
@pytest.mark.parametrize("path", PATHS)
def test_bond_given_back_after_reboot(node_ns: Node, path: str, variant: str, family: str) -> None:
    n = node_ns
    n.bond("bond0", peer="198.51.100.1/28")
    sh("ip", "-n", n.switch, "addr", "add", "2001:db8:1::1/64", "dev", f"p0-{n.tag[:6]}")
    node_config(n, family, "same")
    conf = n.config(masters=["bond0"])
    before, t0 = n.snapshot(), time.monotonic()
    pod = n.pod()
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert bond_addrs(n) == []
    reboot(n, pod, family)
    then = None  # "nothing": the record's remaining lifetimes, the same deadlines as before
    if variant == "same":  # the node's config gives its addresses fresh lifetimes
        t0, then = time.monotonic(), ({"2001:db8:1::3/64": (3000, 2000)} if family == "dual" else {})
    node_config(n, family, variant)
    log = give_back(n, path, conf, pod)
    assert n.state_files() == [] and n.pins() == {}
    if variant != "readdress":
        assert_same_node(before, n.snapshot(), time.monotonic() - t0, then)
        return
    # Re-addressed: only what the node's config gave, nothing of the record.
    want = [NEW_V4] + ([NEW_V6] if family == "dual" else [])
    assert sorted(bond_addrs(n)) == sorted(want)
    routes = json.dumps(n.snapshot()["route4"]) + json.dumps(n.snapshot()["route6"])
    assert "203.0.113.0" not in routes and '"table": "10"' not in routes and "2001:db8:100::" not in routes
    rules = json.dumps(n.snapshot()["rule4"]) + json.dumps(n.snapshot()["rule6"])
    assert "198.51.100.2" not in rules and "2001:db8:1::2" not in rules
    with open(log) as f:
        lines = [line for line in f if "was re-addressed" in line]
    assert len(lines) == 1, lines
    assert "198.51.100.2/28" in lines[0] and NEW_V4 in lines[0]
    # The next pod gets exactly the new address(es), and gives them back.
    pod2 = n.pod()
    res = n.plugin("ADD", conf, pod2, container_id="c2")
    assert res.code == 0, res.stdout + res.stderr
    assert sorted(ip["address"] for ip in res.out["ips"]) == sorted(want)
    pod_link = next(x for x in n.pod_json(pod2, "addr") if x["ifname"] == "bond0")
    assert sorted(f"{a['local']}/{a['prefixlen']}" for a in pod_link["addr_info"]) == sorted(want)
    assert n.plugin("DEL", conf, pod2, container_id="c2").code == 0
    assert sorted(bond_addrs(n)) == sorted(want)


def test_state_and_doctor_show_a_skipped_restore_until_the_bond_is_handed_out_again(node_ns: Node) -> None:
    n = node_ns
    n.bond("bond0", peer="198.51.100.1/28")
    node_config(n, "v4", "same")
    conf = n.config(masters=["bond0"])
    pod = n.pod()
    assert n.plugin("ADD", conf, pod, container_id="c0ffee").code == 0
    reboot(n, pod, "v4")
    node_config(n, "v4", "readdress")
    assert n.plugin("DEL", conf, "", container_id="c0ffee").code == 0
    for cmd in (["state"], ["doctor"]):
        out = cni_tool(n, *cmd).stdout
        line = next(x for x in out.splitlines() if "re-addressed" in x)
        assert "WARN" in line and "198.51.100.2/28, 198.51.100.3/28" in line and NEW_V4 in line, out
        assert "c0ffee" in line
    state = json.loads(cni_tool(n, "state", "--json").stdout)
    assert state["skippedRestores"][0]["recorded"] == ["198.51.100.2/28", "198.51.100.3/28"]
    assert state["skippedRestores"][0]["current"] == [NEW_V4]
    pod2 = n.pod()
    assert n.plugin("ADD", conf, pod2, container_id="c2").code == 0
    assert "re-addressed" not in cni_tool(n, "state").stdout
    assert n.plugin("DEL", conf, pod2, container_id="c2").code == 0
