"""The result model: parse(render(r, v)) keeps what version v can carry; merge re-points indexes."""

from __future__ import annotations

import pytest

from rdma_cni.cni.errors import INVALID_CONFIG, CniError
from rdma_cni.cni.result import DNS, Interface, IPConfig, Result, Route, parse, render

VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")


def _full() -> Result:
    return Result(
        interfaces=[
            Interface(
                "net1",
                mac="02:00:00:00:00:01",
                mtu=9000,
                sandbox="/var/run/netns/p",
                socket_path="/s",
                pci_id="0000:3b:00.0",
            )
        ],
        ips=[IPConfig("198.51.100.2/24", "198.51.100.1", 0), IPConfig("2001:db8::2/64", interface=0)],
        routes=[Route("203.0.113.0/24", "198.51.100.1", mtu=1400, advmss=1360, priority=5, table=7, scope=0),
                Route("203.0.113.128/25", "198.51.100.1", priority=9, table=254)],
        dns=DNS(["198.51.100.53"], "d", ["s"], ["o"]),
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_round_trip_keeps_what_the_version_carries(version: str) -> None:
    back = parse(render(_full(), version))
    expected = _full()
    if version != "1.1.0":  # 1.1-only fields are dropped by older versions, nothing else
        expected.interfaces[0].mtu = 0
        expected.interfaces[0].socket_path = expected.interfaces[0].pci_id = ""
        del expected.routes[0]  # in table 7: not listable without 'table' (it would read as main)
        r = expected.routes[0]
        r.priority = 0
        r.table = None
    assert back == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_routes_outside_the_main_table_are_listed_only_where_table_can_be_said(version: str) -> None:
    res = Result(routes=[Route("0.0.0.0/0", "198.51.100.1", table=100),
                         Route("203.0.113.0/24", "198.51.100.1"),
                         Route("203.0.113.0/28", "198.51.100.1", table=254)])
    out = render(res, version)["routes"]
    if version == "1.1.0":
        assert out == [{"dst": "0.0.0.0/0", "gw": "198.51.100.1", "table": 100},
                       {"dst": "203.0.113.0/24", "gw": "198.51.100.1"},
                       {"dst": "203.0.113.0/28", "gw": "198.51.100.1", "table": 254}]
    else:
        assert out == [{"dst": "203.0.113.0/24", "gw": "198.51.100.1"},
                       {"dst": "203.0.113.0/28", "gw": "198.51.100.1"}]


def test_render_refuses_unknown_version() -> None:
    with pytest.raises(ValueError, match=r"0\.2\.0"):
        render(_full(), "0.2.0")


def test_empty_result_still_has_dns_object() -> None:
    assert render(Result(), "1.0.0") == {"cniVersion": "1.0.0", "dns": {}}


def test_merge_repoints_interface_indexes() -> None:
    a = Result(interfaces=[Interface("eth0")], ips=[IPConfig("198.51.100.2/24", interface=0)])
    b = Result(
        interfaces=[Interface("net1"), Interface("net2")],
        ips=[IPConfig("203.0.113.2/24", interface=1), IPConfig("203.0.113.3/24")],
        routes=[Route("0.0.0.0/0")],
    )
    a.merge(b)
    assert [i.name for i in a.interfaces] == ["eth0", "net1", "net2"]
    assert [(ip.address, ip.interface) for ip in a.ips] == [
        ("198.51.100.2/24", 0),
        ("203.0.113.2/24", 2),
        ("203.0.113.3/24", None),
    ]
    assert [r.dst for r in a.routes] == ["0.0.0.0/0"]


@pytest.mark.parametrize(
    "data, field",
    [
        ({"interfaces": [{"name": 1}]}, "'name'"),
        ({"interfaces": "eth0"}, "'interfaces'"),
        ({"ips": [{"address": "198.51.100.2/24", "interface": True}]}, "'interface'"),
        ({"routes": [{"dst": "203.0.113.0/24", "table": "main"}]}, "'table'"),
        ({"dns": []}, "'dns'"),
        ({"dns": {"search": [1]}}, "dns.search"),
    ],
)
def test_parse_errors_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(CniError) as err:
        parse(data, what="delegate result")
    assert err.value.code == INVALID_CONFIG
    assert err.value.msg.startswith("delegate result is not a valid CNI result") and field in err.value.msg
