"""Finite address lifetimes over many moves: a bond's IPv4 and IPv6 addresses with a finite valid and
preferred lifetime go into a pod and back 100 times, and afterwards expire when they would have had
they never moved (within a second). Measured on the kernel's own clock: ``IFA_CACHEINFO``'s
``tstamp`` (hundredths of a second since boot, the address's last update) plus the lifetime the
kernel was given then is the deadline the kernel keeps; read right after the address was (re)added,
the lifetime it reports is exactly that lifetime. Only the test nets, only in namespaces made here.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from netns import Node, node

from rdma_cni.net.netns import netlink_in, open_netns
from rdma_cni.net.rtnl import attr
from tests.plugins.macvlan.test_readdressed import assert_same_node

pytestmark = pytest.mark.netns

MOVES = 100
FINITE = {"198.51.100.3/28": (3000, 2000), "2001:db8:1::3/64": (2900, 1900)}


def kernel_deadlines(n: Node, since: float) -> dict[str, tuple[int, int]] | None:
    """Each finite address's (valid, preferred) deadline in the kernel's hundredths since boot, when
    every one was last updated after ``since`` (time.monotonic()) and less than a second ago: then
    the whole seconds the kernel took off its lifetimes (age, rounded down) are 0. None otherwise."""
    with open_netns(os.path.join("/run/netns", n.name)) as ns, netlink_in(ns) as ipr:
        dump = ipr.addr_dump()
    if time.monotonic() - since >= 1.0:
        return None
    out = {}
    for m in dump:
        info = attr(m, "IFA_CACHEINFO")
        cidr = f"{attr(m, 'IFA_ADDRESS')}/{m['prefixlen']}"
        if cidr in FINITE:
            t = int(info["tstamp"])
            out[cidr] = (t + 100 * int(info["ifa_valid"]), t + 100 * int(info["ifa_preferred"]))
    assert sorted(out) == sorted(FINITE), out
    return out


def test_100_moves_keep_each_finite_lifetime_within_a_second_of_its_deadline() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    with node("agent") as n:  # the warm agent: 200 calls in seconds, not minutes
        n.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
        since = time.monotonic()
        for cidr, (valid, preferred) in FINITE.items():
            n.ip(
                "addr", "add", cidr, "valid_lft", str(valid), "preferred_lft", str(preferred), "dev", "bond0"
            )
        first = kernel_deadlines(n, since)
        assert first is not None, "adding two addresses took a second"
        conf = n.config(masters=["bond0"])
        last = None
        for i in range(MOVES + 5):  # a few more when the last DEL and the dump took a second
            pod = n.pod()
            res = n.plugin("ADD", conf, pod, container_id=f"m{i}")
            assert res.code == 0, res.stdout + res.stderr
            since = time.monotonic()
            res = n.plugin("DEL", conf, pod, container_id=f"m{i}")
            assert res.code == 0, res.stdout + res.stderr
            n.delete_pod(pod)
            if i + 1 >= MOVES:
                last = kernel_deadlines(n, since)
                if last is not None:
                    break
        assert last is not None, "no DEL and dump within a second in 5 tries"
        errors = {c: ((last[c][0] - first[c][0]) / 100, (last[c][1] - first[c][1]) / 100) for c in FINITE}
        print(f"deadline error after {i + 1} ADD/DEL cycles (valid, preferred), seconds: {errors}")
        for cidr, (valid_err, preferred_err) in errors.items():
            assert abs(valid_err) < 1.0, (cidr, errors)
            assert abs(preferred_err) < 1.0, (cidr, errors)


def _rewrite_lifetimes(n: Node, how: str) -> int:
    """Make the attachment's record look written by an older version (no deadlines) or on another
    boot; both the write-ahead record and its commit. Returns how many lifetimes were rewritten."""
    changed = 0
    folder = os.path.join(n.data_dir, "attachments")
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        with open(path) as f:
            body = json.load(f)
        rec = body.get("record", body)
        for bond in rec["bonds"]:
            for a in bond["addresses"]:
                life = a.get("lifetimes")
                if not life:
                    continue
                changed += 1
                if how == "older-version":
                    for key in ("tstamp", "validUntil", "preferredUntil", "boot"):
                        del life[key]
                else:
                    life["boot"] = "00000000-0000-0000-0000-000000000000"
        stat = os.stat(path)
        with open(path, "w") as f:
            json.dump(body, f)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the commit's stamp still matches
    return changed


@pytest.mark.parametrize("how", ["older-version", "other-boot"])
def test_a_record_without_deadlines_of_this_boot_still_restores_the_lifetimes(
    node_ns: Node, how: str
) -> None:
    n = node_ns
    n.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
    n.ip("addr", "add", "2001:db8:1::2/64", "dev", "bond0")  # the prefix route forever (no "expires")
    for cidr, (valid, preferred) in FINITE.items():
        n.ip("addr", "add", cidr, "valid_lft", str(valid), "preferred_lft", str(preferred), "dev", "bond0")
    conf = n.config(masters=["bond0"])
    before, t0 = n.snapshot(), time.monotonic()
    pod = n.pod()
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert _rewrite_lifetimes(n, how) == 2 * len(FINITE)  # the record and its commit
    res = n.plugin("DEL", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert_same_node(before, n.snapshot(), time.monotonic() - t0)
