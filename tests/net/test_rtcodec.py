"""The struct codec of address, route and rule messages agrees with pyroute2's, on the real kernel.

Every message of a pod netns made here (addresses with labels, lifetimes and metrics; routes with
metrics, preferences, tables over 255, expiry; multipath; rules with every selector) is decoded by
both and must give the same record; every record state would keep is encoded by both and must give
the same bytes. What the codec leaves to pyroute2 must be exactly the shapes it does not know, and
the result through :mod:`rdma_cni.net.rtnl` must still be pyroute2's.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
from netns import Node

from rdma_cni.net import rtcodec, rtnl
from rdma_cni.net.netns import netlink_in, open_netns
from rdma_cni.net.nlsock import RTM_GETADDR, RTM_GETROUTE, RTM_GETRULE

pytestmark = pytest.mark.netns

VARIETY = [
    "link add v0 type veth peer name v1",
    "link set v0 up",
    "link set v1 up",
    "addr add 198.51.100.2/28 dev v0 label v0:lab",
    "addr add 198.51.100.3/28 dev v0 valid_lft 300 preferred_lft 200",
    "addr add 203.0.113.9/24 broadcast 203.0.113.255 dev v0 metric 55",
    "addr add 2001:db8::2/64 dev v0 nodad",
    "addr add 2001:db8:1::2/64 dev v0 nodad valid_lft 600 preferred_lft 100 noprefixroute",
    "route add 203.0.113.128/25 via 198.51.100.1 dev v0 metric 77 proto static mtu 1400 advmss 1360",
    "route add 198.51.100.64/26 dev v0 src 198.51.100.2 table 1234 scope link",
    "route add default via 198.51.100.1 dev v0 table 100 onlink",
    "route add 2001:db8:5::/48 via 2001:db8::1 dev v0 pref high metric 300",
    "route add 2001:db8:6::/48 dev v0 table 200 mtu lock 1280 congctl cubic",
    "-6 route add 2001:db8:8::/48 dev v0 expires 100",
    "route add blackhole 203.0.113.64/27",
    "route add unreachable 2001:db8:7::/48",
    "route add 203.0.113.96/28 nexthop via 198.51.100.1 dev v0 weight 2"
    " nexthop via 198.51.100.4 dev v0 weight 1",
    "rule add from 198.51.100.2 table 100 priority 100",
    "rule add to 203.0.113.0/24 iif v0 table 1234 priority 200 fwmark 0x10/0xff",
    "rule add oif v0 lookup main suppress_prefixlength 0 priority 300",
    "-6 rule add from 2001:db8::2 table 200 priority 100 proto static",
    "rule add not from 198.51.100.0/24 goto 400 priority 350",
]
ADDR: dict[str, Any] = {"family": 2, "prefixlen": 24, "flags": 0, "scope": 0, "index": 3, "attrs": []}
DUMPS = {"addr": RTM_GETADDR, "route": RTM_GETROUTE, "rule": RTM_GETRULE}


def _pyroute2_encoded(kind: str, rec: dict[str, Any], seq: int, msg_type: int = 20) -> bytes:
    return rtnl.pyroute2_encode(kind, rec, msg_type, 0x405, seq)


@pytest.fixture
def messages(node_ns: Node) -> Iterator[dict[str, list[bytes]]]:
    pod = node_ns.pod()
    for line in VARIETY:
        node_ns.pod_exec(pod, "ip", *line.split())
    ns = open_netns(pod.path)
    with ns:
        ipr = netlink_in(ns)
        try:
            yield {kind: ipr.dump(t, bytes(8 if kind == "addr" else 12)) for kind, t in DUMPS.items()}
        finally:
            ipr.close()


def test_decode_and_encode_agree_with_pyroute2_on_every_kernel_message(
    messages: dict[str, list[bytes]],
) -> None:
    fast = {kind: 0 for kind in DUMPS}
    left: list[str] = []
    for kind, raws in messages.items():
        for seq, data in enumerate(raws, 1):
            ref = rtnl.pyroute2_decode(kind, data)
            assert rtnl.decode(kind, data) == ref  # whichever codec did it
            try:
                got = rtcodec.decode(kind, data)
            except rtcodec.Unsupported:
                left.append(f"{kind}:{','.join(a[0] for a in ref['attrs'])}:family={ref['family']}")
                continue
            assert got == ref, kind
            fast[kind] += 1
            stored = rtnl.record(kind, got)
            want = _pyroute2_encoded(kind, stored, seq)
            assert rtcodec.encode(kind, stored, 20, 0x405, seq) == want, stored
            assert rtnl.encode(kind, stored, 20, 0x405, seq) == want
    # The codec did the common shapes itself (addresses, IPv4/IPv6 unicast routes, rules)...
    assert fast["addr"] >= 7 and fast["route"] >= 15 and fast["rule"] >= 8, fast
    # ...and left pyroute2 only the multipath route and the multicast-routing families' rules.
    assert any(s.startswith("route:") and "RTA_MULTIPATH" in s for s in left), left
    for shape in left:
        multicast_rule = shape.startswith("rule:") and not shape.endswith(("=2", "=10"))
        assert "RTA_MULTIPATH" in shape or multicast_rule, shape


def test_a_stored_multipath_route_still_encodes_as_pyroute2_does(messages: dict[str, list[bytes]]) -> None:
    multipath = [rtnl.record("route", rtnl.decode("route", m)) for m in messages["route"]]
    multipath = [r for r in multipath if rtnl.attr(r, "RTA_MULTIPATH") is not None]
    assert multipath
    for rec in multipath:
        with pytest.raises(rtcodec.Unsupported):
            rtcodec.encode("route", rec, 24, 0x405, 9)
        assert rtnl.encode("route", rec, 24, 0x405, 9) == _pyroute2_encoded("route", rec, 9, 24)


@pytest.mark.parametrize(
    "rec",
    [
        dict(ADDR, attrs=[["IFA_LOCAL", "not-an-ip"]]),
        dict(ADDR, attrs=[["IFA_FLAGS", "0x80"]]),
        dict(ADDR, attrs=[["IFA_SOMETHING", 1]]),
        dict(ADDR, flags="permanent"),
        dict(ADDR, attrs=[["IFA_FLAGS"]]),
    ],
    ids=["bad-ip", "text-int", "unknown-attr", "text-flags", "not-a-pair"],
)
def test_a_record_it_cannot_encode_is_refused_not_guessed(rec: dict[str, Any]) -> None:
    with pytest.raises(rtcodec.Unsupported):
        rtcodec.encode("addr", rec, 20, 0x405, 1)


def test_a_truncated_or_malformed_message_is_left_to_pyroute2() -> None:
    rec = {"family": 2, "prefixlen": 24, "flags": 0x80, "scope": 0, "index": 3,
           "attrs": [["IFA_LOCAL", "198.51.100.2"], ["IFA_LABEL", "bond0"]]}
    data = rtcodec.encode("addr", rec, 20, 0, 1)
    assert rtcodec.decode("addr", data) == rec
    with pytest.raises(rtcodec.Unsupported):
        rtcodec.decode("addr", data[:-4])  # the header says longer than what arrived
    bad_size = bytearray(data)
    struct.pack_into("=H", bad_size, 16 + 8, 200)  # first attribute claims 200 bytes
    with pytest.raises(rtcodec.Unsupported):
        rtcodec.decode("addr", bytes(bad_size))
