"""rdma-ipvlan's address choice (a pure function) and its config: what is never handed out, ranges
and exclude, a full subnet, and error 7 naming the key and the fix for every bad value."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from rdma_cni.cni.errors import INVALID_CONFIG, CniError
from rdma_cni.plugins.ipvlan.config import check_ranges, parse_config, parse_del_config
from rdma_cni.plugins.ipvlan.pool import Subnet, choose, free_count, host_span, parse_span


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def subnet(net: str = "198.51.100.0/28", *reserved: str) -> Subnet:
    return Subnet("bond0", ipaddress.ip_network(net), frozenset(ip(r) for r in reserved))


def test_never_network_broadcast_own_addresses_or_gateways() -> None:
    s = subnet("198.51.100.0/28", "198.51.100.1", "198.51.100.2")
    got = []
    held: set[Any] = set()
    while (nxt := choose(s, [], [], held)) is not None:
        got.append(str(nxt))
        held.add(nxt)
    assert got == [f"198.51.100.{i}" for i in range(3, 15)]  # .0 network, .15 broadcast, .1/.2 reserved
    assert free_count(s, [], [], set()) == 12 and free_count(s, [], [], held) == 0


def test_ranges_are_inclusive_and_exclude_takes_addresses_and_whole_cidrs() -> None:
    s = subnet("198.51.100.0/28", "198.51.100.2")
    ranges = [parse_span("198.51.100.4-198.51.100.14")]
    exclude = [parse_span("198.51.100.9"), parse_span("198.51.100.12/30")]
    held: set[Any] = set()
    got = []
    while (nxt := choose(s, ranges, exclude, held)) is not None:
        got.append(str(nxt))
        held.add(nxt)
    assert got == [
        "198.51.100.4",
        "198.51.100.5",
        "198.51.100.6",
        "198.51.100.7",
        "198.51.100.8",
        "198.51.100.10",
        "198.51.100.11",
    ]


def test_held_addresses_are_skipped_and_a_freed_one_is_chosen_again() -> None:
    s = subnet("198.51.100.0/29", "198.51.100.1")
    held = {ip("198.51.100.2"), ip("198.51.100.3")}
    assert choose(s, [], [], held) == ip("198.51.100.4")
    held.discard(ip("198.51.100.2"))
    assert choose(s, [], [], held) == ip("198.51.100.2")


def test_ipv6_subnet_skips_the_router_anycast_and_respects_a_range_of_its_family_only() -> None:
    s = Subnet("bond0", ipaddress.ip_network("2001:db8:1::/64"), frozenset({ip("2001:db8:1::2")}))
    assert choose(s, [], [], set()) == ip("2001:db8:1::1")
    v4_range = [parse_span("198.51.100.4-198.51.100.6")]
    assert choose(s, v4_range, [], {ip("2001:db8:1::1")}) == ip("2001:db8:1::3")
    assert choose(s, [parse_span("2001:db8:1::100-2001:db8:1::101")], [], set()) == ip("2001:db8:1::100")


def test_point_to_point_prefixes_and_a_full_pool() -> None:
    assert host_span(ipaddress.ip_network("198.51.100.4/31")) is not None
    s = subnet("198.51.100.4/30", "198.51.100.5")
    assert choose(s, [], [], {ip("198.51.100.6")}) is None


def test_a_range_outside_the_bond_subnet_is_error_7_naming_it() -> None:
    s = subnet("198.51.100.0/28")
    with pytest.raises(CniError) as exc:
        check_ranges(s, [parse_span("198.51.100.10-198.51.100.20")])
    assert exc.value.code == INVALID_CONFIG
    assert "ranges.bond0" in exc.value.msg and "198.51.100.0/28" in exc.value.msg
    check_ranges(s, [parse_span("198.51.100.4-198.51.100.14"), parse_span("2001:db8::/64")])


@pytest.mark.parametrize(
    ("conf", "key"),
    [
        ({"link": "vxlan"}, "'link'"),
        ({"ipvlanMode": "l4"}, "'ipvlanMode'"),
        ({"masters": []}, "'masters'"),
        ({"masters": "bond0"}, "'masters'"),
        ({"ranges": {"bond0": "198.51.100.9-198.51.100.4"}}, "'ranges.bond0'"),
        ({"ranges": {"bond0": "nonsense"}}, "'ranges.bond0'"),
        ({"ranges": {"bond0": 5}}, "'ranges.bond0'"),
        ({"ranges": {"bond0": []}}, "'ranges.bond0'"),
        ({"ranges": ["198.51.100.4-198.51.100.9"]}, "'ranges'"),
        ({"exclude": ["198.51.100.0/40"]}, "'exclude[0]'"),
        ({"exclude": "198.51.100.9"}, "'exclude'"),
        ({"mtu": 10}, "'mtu'"),
        ({"rdma": {"required": "yes"}}, "'rdma.required'"),
        ({"rdma": {"gidTimeoutMs": -1}}, "'rdma.gidTimeoutMs'"),
        ({"dataDir": ""}, "'dataDir'"),
        ({"logLevel": "loud"}, "'logLevel'"),
    ],
)
def test_bad_config_value_is_error_7_naming_the_key_and_the_fix(conf: dict[str, Any], key: str) -> None:
    with pytest.raises(CniError) as exc:
        parse_config(conf)
    assert exc.value.code == INVALID_CONFIG
    assert f"config key {key}" in exc.value.msg, exc.value.msg
    assert "use " in exc.value.msg or ": " in exc.value.msg  # the fix follows the problem


def test_defaults_and_del_config_drops_a_bad_key_but_not_a_bad_data_dir() -> None:
    cfg, pools = parse_config({})
    assert (cfg.link, cfg.ipvlan_mode, cfg.data_dir, cfg.run_dir) == (
        "ipvlan",
        "l2",
        "/var/lib/cni/rdma-ipvlan",
        "/run/rdma-cni",
    )
    assert cfg.rdma.required is True and pools.ranges == {}
    cfg, dropped = parse_del_config({"dataDir": "/x", "link": "vxlan", "ranges": {"bond0": "x"}})
    assert cfg.data_dir == "/x" and cfg.link == "ipvlan" and len(dropped) == 2
    with pytest.raises(CniError):
        parse_del_config({"dataDir": 5})
