"""Bad input never wedges a node (issue 15), through rdma-macvlan's real executable in namespaces.

Every case ends the same way: DEL succeeded (or failed only for the IPAM part, then succeeded once
IPAM was reachable again), no record or pin is left, the node's addresses/routes/rules/links are
exactly as before, and the next pod gets the bond.

IPAM here is Debian's ``host-local`` behind ``flaky-ipam``, a wrapper that answers a CNI error for
a verb while ``fail-<VERB>`` exists in its directory (an IPAM whose store is unreachable).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from netns import Node, Pod

pytestmark = [pytest.mark.netns, pytest.mark.both_modes]

HOST_LOCAL = Path("/usr/lib/cni/host-local")
OWN_NETNS_MSG = "plugin's netns and netns from CNI_NETNS should not be the same"

if not HOST_LOCAL.exists():
    pytest.skip("needs Debian's containernetworking-plugins (host-local)", allow_module_level=True)


class Ipam:
    """A CNI_PATH directory holding ``flaky-ipam`` and a host-local store for it."""

    def __init__(self, n: Node) -> None:
        self.dir = Path(n.tmp) / "ipam-bin"
        self.store = Path(n.tmp) / "ipam-store"
        self.dir.mkdir()
        self.binary = self.dir / "flaky-ipam"
        self.install()

    def install(self) -> None:
        self.binary.write_text(
            "#!/bin/sh\n"
            f'if [ -e {self.dir}/fail-"$CNI_COMMAND" ]; then\n'
            '  echo \'{"cniVersion":"1.0.0","code":11,"msg":"IPAM store unreachable"}\'; exit 1\n'
            "fi\n"
            f"exec {HOST_LOCAL}\n"
        )
        self.binary.chmod(0o755)

    def fail(self, verb: str, on: bool = True) -> None:
        flag = self.dir / f"fail-{verb}"
        if on:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    def config(self, kind: str = "flaky-ipam") -> dict[str, object]:
        return {"type": kind, "dataDir": str(self.store),
                "ranges": [[{"subnet": "198.51.100.0/28", "rangeStart": "198.51.100.10",
                             "rangeEnd": "198.51.100.12"}]]}

    def env(self) -> dict[str, str]:
        return {"CNI_PATH": str(self.dir)}

    def leases(self) -> list[str]:
        d = self.store / "rdma-net"
        return sorted(p for p in os.listdir(d) if p[0].isdigit()) if d.is_dir() else []


def bond0(n: Node) -> dict[str, object]:
    """bond0 with 198.51.100.2/28 (peer .1 in the switch) and a route through it; the snapshot."""
    n.bond("bond0", "198.51.100.2/28 brd +", peer="198.51.100.1/28")
    n.ip("route", "add", "203.0.113.0/28", "via", "198.51.100.1", "metric", "50")
    return n.snapshot()


def links_in(n: Node, pod: Pod) -> list[str]:
    return [link["ifname"] for link in n.pod_json(pod, "link")]


def assert_clean(n: Node, before: dict[str, object]) -> None:
    assert n.state_files() == [] and n.pins() == {}
    assert n.snapshot() == before


def assert_next_pod_gets_the_bond(n: Node, before: dict[str, object]) -> None:
    """A fresh pod (another container) with a plain config gets bond0 and its address, then DEL."""
    pod = n.pod()
    conf = n.config(masters=["bond0"])
    res = n.plugin("ADD", conf, pod, container_id="next-pod")
    assert res.code == 0, res.stdout + res.stderr
    assert [i["name"] for i in res.out["interfaces"]] == ["bond0"]
    assert n.pins() == {"bond0": "next-pod"}
    assert n.plugin("DEL", conf, pod, container_id="next-pod").code == 0
    assert_clean(n, before)


def plugin_log(n: Node) -> str:
    with open(os.path.join(n.tmp, "plugin.log")) as f:
        return f.read()


# ------------------------------------------------------------------ IPAM
def test_invalid_ipam_type_is_7_before_anything_and_del_skips_it(node_ns: Node) -> None:
    n = node_ns
    before = bond0(n)
    pod = n.pod()
    conf = n.config(masters=["bond0"], ipam={"type": "../../../bin/sh"})
    res = n.plugin("ADD", conf, pod)
    assert res.code == 1 and res.out["code"] == 7, res.out
    assert "'ipam.type'" in res.out["msg"] and "../../../bin/sh" in res.out["msg"]
    assert_clean(n, before)
    assert links_in(n, pod) == ["lo"]
    res = n.plugin("DEL", conf, pod)  # the runtime's DEL after the failed ADD, same config
    assert res.code == 0, res.stdout
    assert "IPAM type '../../../bin/sh' is not a plain executable name" in plugin_log(n)
    assert n.plugin("DEL", conf, pod).code == 0  # and again
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)


def test_ipam_failing_at_del_is_reported_after_the_host_is_restored(node_ns: Node) -> None:
    n = node_ns
    ipam = Ipam(n)
    before = bond0(n)
    pod = n.pod()
    conf = n.config(masters=["bond0"], ipam=ipam.config())
    res = n.plugin("ADD", conf, pod, extra=ipam.env())
    assert res.code == 0, res.stdout + res.stderr
    assert ipam.leases() == ["198.51.100.10"]
    ipam.fail("DEL")
    res = n.plugin("DEL", conf, pod, extra=ipam.env())
    assert res.code == 1 and res.out["code"] == 11, res.out
    assert "host is restored" in res.out["msg"] and "IPAM store unreachable" in res.out["msg"]
    # Everything of ours is undone already: the pod's interface, the pin; only the IPAM part stays.
    assert links_in(n, pod) == ["lo"]
    assert n.pins() == {} and n.snapshot() == before
    (record,) = [f for f in n.state_files() if f.endswith(".json")]
    with open(os.path.join(n.data_dir, "attachments", record)) as f:
        kept = json.load(f)
    assert kept["phase"] == "ipam-pending" and kept["bonds"] == [] and kept["ipam"]["type"] == "flaky-ipam"
    assert n.state_files() == [record]  # the commit record went with the bonds
    # The bond is free for the next pod while the first one's lease waits for IPAM.
    res = n.plugin("ADD", n.config(masters=["bond0"]), n.pod(), container_id="other")
    assert res.code == 0, res.stdout
    assert n.plugin("DEL", n.config(masters=["bond0"]), "", container_id="other").code == 0
    res = n.plugin("CHECK", conf, pod, extra=ipam.env())
    assert res.code == 1 and res.out["code"] == 107  # not a live attachment any more
    res = n.plugin("DEL", conf, pod, extra=ipam.env())  # still unreachable: still that error
    assert res.code == 1 and res.out["code"] == 11 and ipam.leases() == ["198.51.100.10"]
    ipam.fail("DEL", on=False)
    res = n.plugin("DEL", conf, pod, extra=ipam.env())
    assert res.code == 0, res.stdout
    assert ipam.leases() == []
    assert_clean(n, before)
    assert n.plugin("DEL", conf, pod, extra=ipam.env()).code == 0
    assert_next_pod_gets_the_bond(n, before)


def test_ipam_binary_missing_at_del_is_reported_and_retried_alone(node_ns: Node) -> None:
    n = node_ns
    ipam = Ipam(n)
    before = bond0(n)
    pod = n.pod()
    conf = n.config(masters=["bond0"], ipam=ipam.config())
    assert n.plugin("ADD", conf, pod, extra=ipam.env()).code == 0
    ipam.binary.unlink()  # uninstalled between the pod's start and its end
    res = n.plugin("DEL", conf, pod, extra=ipam.env())
    assert res.code == 1 and res.out["code"] == 7, res.out
    assert "flaky-ipam" in res.out["msg"] and "not found" in res.out["msg"]
    assert "host is restored" in res.out["msg"]
    assert links_in(n, pod) == ["lo"] and n.pins() == {} and n.snapshot() == before
    n.delete_pod(pod)  # the retry needs nothing of the pod: its netns may be gone by now
    res = n.plugin("ADD", n.config(masters=["bond0"]), n.pod(), container_id="other")
    assert res.code == 0, res.stdout  # the bond is not held by the half-deleted pod
    # ...and that ADD did not try the IPAM release itself (it pins nothing; an IPAM that hangs
    # must not hold every ADD of the node under the node lock): that stays DEL's and GC's job.
    assert "reclaiming" not in plugin_log(n)
    assert n.plugin("DEL", n.config(masters=["bond0"]), "", container_id="other").code == 0
    ipam.install()
    res = n.plugin("DEL", conf, pod, extra=ipam.env())
    assert res.code == 0, res.stdout
    assert ipam.leases() == []
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)


def test_gc_gives_the_bond_back_and_retries_only_the_ipam_release(node_ns: Node) -> None:
    n = node_ns
    ipam = Ipam(n)
    before = bond0(n)
    pod = n.pod()
    conf = n.config(masters=["bond0"], ipam=ipam.config())  # Debian's host-local speaks up to 1.0.0
    assert n.plugin("ADD", conf, pod, extra=ipam.env()).code == 0
    gc = {**conf, "cniVersion": "1.1.0", "cni.dev/valid-attachments": []}
    ipam.fail("DEL")
    res = n.plugin("GC", gc, "", container_id="", ifname="", extra=ipam.env())
    assert res.code == 1 and res.out["code"] == 11 and "IPAM store unreachable" in res.out["msg"], res.out
    assert links_in(n, pod) == ["lo"] and n.pins() == {} and n.snapshot() == before
    ipam.fail("DEL", on=False)
    assert n.plugin("GC", gc, "", container_id="", ifname="", extra=ipam.env()).code == 0
    assert ipam.leases() == []
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)


def test_del_without_a_record_still_releases_ipam_and_reports_its_failure(node_ns: Node) -> None:
    """The runtime's DEL for an ADD that never got as far as the record: IPAM's DEL must still run."""
    n = node_ns
    ipam = Ipam(n)
    before = bond0(n)
    conf = n.config(masters=["bond0"], ipam=ipam.config())
    ipam.fail("DEL")
    res = n.plugin("DEL", conf, "", container_id="never-added", extra=ipam.env())
    assert res.code == 1 and res.out["code"] == 11 and "IPAM store unreachable" in res.out["msg"]
    ipam.fail("DEL", on=False)
    assert n.plugin("DEL", conf, "", container_id="never-added", extra=ipam.env()).code == 0
    assert_clean(n, before)


def test_add_after_a_failed_add_with_another_config_same_container(node_ns: Node) -> None:
    """The ADD the runtime retries with a fixed config must not stumble over the failed attempt."""
    n = node_ns
    ipam = Ipam(n)
    before = bond0(n)
    pod = n.pod()
    good = n.config(masters=["bond0"])
    # 1. The case: a config error, then the same container with a good config.
    bad = n.config(masters=["bond0"], ipam={"type": "../../../bin/sh"})
    assert n.plugin("ADD", bad, pod).out["code"] == 7
    res = n.plugin("ADD", good, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert n.pins() == {"bond0": "c1"}
    assert n.plugin("DEL", good, pod).code == 0
    assert_clean(n, before)
    # 2. IPAM failing both ways: ADD fails and its rollback cannot release the lease.
    ipam.fail("ADD")
    ipam.fail("DEL")
    res = n.plugin("ADD", n.config(masters=["bond0"], ipam=ipam.config()), pod, extra=ipam.env())
    assert res.code == 1 and res.out["code"] == 11, res.out
    assert n.pins() == {} and n.snapshot() == before and links_in(n, pod) == ["lo"]
    # The retry with another config first undoes the recorded attempt: same rules as DEL.
    res = n.plugin("ADD", good, pod, extra=ipam.env())
    assert res.code == 1 and res.out["code"] == 11, res.out
    assert "earlier ADD" in res.out["msg"] and "IPAM store unreachable" in res.out["msg"]
    assert n.pins() == {} and n.snapshot() == before and links_in(n, pod) == ["lo"]
    ipam.fail("DEL", on=False)
    res = n.plugin("ADD", good, pod, extra=ipam.env())
    assert res.code == 0, res.stdout + res.stderr
    assert n.pins() == {"bond0": "c1"} and links_in(n, pod) == ["lo", "bond0"]
    assert n.plugin("DEL", good, pod).code == 0
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)


def test_add_over_a_recorded_attempt_whose_ipam_type_can_never_run(node_ns: Node) -> None:
    """A record from an older plugin that let a path through as IPAM type: skipped, not fatal."""
    n = node_ns
    ipam = Ipam(n)
    before = bond0(n)
    pod = n.pod()
    assert n.plugin("ADD", n.config(masters=["bond0"], ipam=ipam.config()), pod, extra=ipam.env()).code == 0
    committed = Path(n.data_dir) / "attachments" / "c1@net1.json.added"
    body = json.loads(committed.read_text())
    body["record"]["ipam"]["type"] = "../../../bin/sh"
    committed.write_text(json.dumps(body))
    good = n.config(masters=["bond0"])
    res = n.plugin("ADD", good, pod, extra=ipam.env())
    assert res.code == 0, res.stdout + res.stderr
    assert n.pins() == {"bond0": "c1"} and links_in(n, pod) == ["lo", "bond0"]
    assert "IPAM type '../../../bin/sh' is not a plain executable name" in plugin_log(n)
    assert n.plugin("DEL", good, pod).code == 0
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)


# ------------------------------------------------------------------ masters
BAD_MASTERS = [
    (["bondX"], "bondX", "does not exist"),
    (["bond0", "bondX"], "bondX", "does not exist"),
    (["lo"], "lo", "loopback"),
]


def assert_7_naming_the_master(out: dict[str, Any], named: str, why: str) -> None:
    """Code 7 whose message names the key, the entry and why it cannot be a bond."""
    assert out["code"] == 7, out
    assert "'masters'" in out["msg"] and repr(named) in out["msg"] and why in out["msg"], out


@pytest.mark.parametrize(("masters", "named", "why"), BAD_MASTERS)
def test_a_masters_entry_that_cannot_be_a_bond_is_7_naming_it_for_add_and_status_alike(
    node_ns: Node, masters: list[str], named: str, why: str
) -> None:
    """ADD refuses it before touching anything; STATUS answers the same error (not "ready")."""
    n = node_ns
    before = bond0(n)
    conf = n.config(masters=masters, cniVersion="1.1.0")
    status = n.plugin("STATUS", conf)
    assert status.code == 1 and "`ip link`" in status.out["msg"], status.out
    assert_7_naming_the_master(status.out, named, why)
    pod = n.pod()
    add = n.plugin("ADD", conf, pod)
    assert (add.code, add.out) == (status.code, status.out)  # one error, whichever verb asks
    assert_clean(n, before)
    assert links_in(n, pod) == ["lo"]
    assert n.plugin("DEL", conf, pod).code == 0
    assert n.plugin("STATUS", conf).out == status.out
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)


def test_status_is_ready_for_a_good_master_and_changes_nothing(node_ns: Node) -> None:
    n = node_ns
    before = bond0(n)
    res = n.plugin("STATUS", n.config(masters=["bond0"], cniVersion="1.1.0"))
    assert (res.code, res.stdout) == (0, ""), res.stdout + res.stderr
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)


def test_all_bonds_busy_is_still_11(node_ns: Node) -> None:
    n = node_ns
    before = bond0(n)
    conf = n.config(masters=["bond0"])
    first = n.pod()
    assert n.plugin("ADD", conf, first).code == 0
    res = n.plugin("ADD", conf, n.pod(), container_id="c2")
    assert res.code == 1 and res.out["code"] == 11 and "bond0 by container c1" in res.out["msg"]
    assert n.plugin("DEL", conf, first).code == 0
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)


# ------------------------------------------------------------------ the plugin's own netns
def test_the_plugins_own_netns_is_refused_with_8_and_nothing_changes(node_ns: Node) -> None:
    n = node_ns
    before = bond0(n)
    own = f"/run/netns/{n.name}"  # the plugin runs in the node netns: this path is its own
    conf = n.config(masters=["bond0"], podIfName="cni")
    for verb in ("ADD", "CHECK", "DEL"):
        res = n.plugin(verb, conf, own)
        assert res.code == 1 and res.out["code"] == 8, (verb, res.out)
        assert res.out["msg"] == OWN_NETNS_MSG
        assert_clean(n, before)
    assert "net1" not in before["links"]  # type: ignore[operator]
    assert_next_pod_gets_the_bond(n, before)


def test_cni_netns_override_allows_the_own_netns_and_del_restores_it(node_ns: Node) -> None:
    n = node_ns
    before = bond0(n)
    own = f"/run/netns/{n.name}"
    conf = n.config(masters=["bond0"], podIfName="cni")
    override = {"CNI_NETNS_OVERRIDE": "1"}
    res = n.plugin("ADD", conf, own, extra=override)
    assert res.code == 0, res.stdout + res.stderr
    node_links = {link["ifname"]: link for link in n.node_json("addr")}
    assert "net1" in node_links  # what the override asked for: the "pod" interface on the node
    assert [a["local"] for a in node_links["net1"]["addr_info"] if a["family"] == "inet"] == ["198.51.100.2"]
    assert n.plugin("CHECK", conf, own, extra=override).code == 0
    res = n.plugin("DEL", conf, own)  # without the override: refused, nothing undone either
    assert res.code == 1 and res.out["code"] == 8
    assert n.pins() == {"bond0": "c1"}
    res = n.plugin("DEL", conf, own, extra=override)
    assert res.code == 0, res.stdout
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)


def test_a_pod_netns_is_not_mistaken_for_the_own_one(node_ns: Node) -> None:
    n = node_ns
    before = bond0(n)
    pod = n.pod()
    conf = n.config(masters=["bond0"], podIfName="cni")
    assert n.plugin("ADD", conf, pod).code == 0
    assert n.plugin("CHECK", conf, pod).code == 0
    assert n.plugin("DEL", conf, pod).code == 0
    assert_clean(n, before)


# ------------------------------------------------------------------ other keys: stop (7/4) or retry (11)
@pytest.mark.parametrize(
    ("keys", "extra", "code", "named"),
    [
        ({"count": 2}, {}, 7, "'count' is 2"),
        ({"runtimeConfig": {"mac": "zz:00:00:00:00:01"}}, {}, 7, "runtimeConfig.mac"),
        ({"runtimeConfig": {"mac": "01:00:5e:00:00:01"}}, {}, 7, "runtimeConfig.mac"),  # multicast
        ({}, {"CNI_ARGS": "IgnoreUnknown=1;MAC=02:00:00:00:01"}, 4, "CNI_ARGS MAC"),
        ({"mtu": 9000}, {}, 7, "'mtu'"),
    ],
)
def test_inputs_that_can_never_succeed_stop_with_their_code_and_change_nothing(
    node_ns: Node, keys: dict[str, object], extra: dict[str, str], code: int, named: str
) -> None:
    n = node_ns
    before = bond0(n)
    pod = n.pod()
    conf = n.config(masters=["bond0"], **keys)
    res = n.plugin("ADD", conf, pod, extra=extra)
    assert res.code == 1 and res.out["code"] == code, res.out
    assert named in res.out["msg"]
    assert_clean(n, before)
    assert links_in(n, pod) == ["lo"]
    assert n.plugin("DEL", conf, pod, extra=extra).code == 0
    assert_next_pod_gets_the_bond(n, before)


def test_del_with_a_config_broken_after_add_still_gives_the_bond_back(node_ns: Node) -> None:
    """The config was edited between ADD and DEL (an upgrade, a typo): DEL must still undo ADD."""
    n = node_ns
    before = bond0(n)
    pod = n.pod()
    assert n.plugin("ADD", n.config(masters=["bond0"]), pod).code == 0
    broken = n.config(masters="bond0", mode="bridgee", rdma={"gidIndex": "three"}, ipam={"kind": "x"})
    assert n.plugin("ADD", broken, n.pod(), container_id="c2").out["code"] == 7  # ADD still refuses it
    res = n.plugin("DEL", broken, pod)
    assert res.code == 0, res.stdout
    assert links_in(n, pod) == ["lo"]
    log_text = plugin_log(n)
    assert "'mode'" in log_text and "using its default to clean up" in log_text
    assert_clean(n, before)
    assert_next_pod_gets_the_bond(n, before)
