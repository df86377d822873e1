"""The config readers' rules, which the plugins' configs rely on (issue 20 replaced pydantic with
them): JSON types strictly, ``null`` only where optional, defaults for absent keys, the path of the
first bad value, and pydantic strict mode's wording that error 7 has always carried."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rdma_cni.cni import config_fields as cf
from rdma_cni.cni.errors import CniError
from rdma_cni.plugins.ipvlan.config import parse_config as ipvlan_config
from rdma_cni.plugins.ipvlan.config import parse_del_config as ipvlan_del_config
from rdma_cni.plugins.macvlan.config import parse_config, parse_del_config


@dataclass(frozen=True)
class Inner:
    on: bool = False


@dataclass(frozen=True)
class Outer:
    count: int = 1
    names: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)
    mtu: int | None = None


FIELDS = (
    cf.field("count", cf.integer(ge=1, le=8), 1),
    cf.Field("names", "names", cf.list_of(cf.string(min_length=1)), list),
    cf.Field("inner", "innerBlock", cf.nested(Inner, (cf.field("on", cf.boolean, False),)), Inner),
    cf.field("mtu", cf.optional(cf.integer()), None),
)


def outer(raw: dict[str, Any]) -> Outer:
    return cf.read(Outer, FIELDS, raw)


def problem(raw: dict[str, Any]) -> tuple[str, str, object]:
    with pytest.raises(cf.Invalid) as exc:
        outer(raw)
    return exc.value.key, exc.value.problem, exc.value.got


def test_absent_keys_take_their_defaults_and_mutable_defaults_are_not_shared() -> None:
    a, b = outer({}), outer({"unknown": [1, 2]})
    assert a == b == Outer()
    assert a.names is not b.names


@pytest.mark.parametrize(
    "raw,want",
    [
        ({"count": "1"}, ("count", "Input should be a valid integer", "1")),
        ({"count": True}, ("count", "Input should be a valid integer", True)),
        ({"count": 2.0}, ("count", "Input should be a valid integer", 2.0)),
        ({"count": 0}, ("count", "Input should be greater than or equal to 1", 0)),
        ({"count": 9}, ("count", "Input should be less than or equal to 8", 9)),
        ({"count": None}, ("count", "Input should be a valid integer", None)),
        ({"names": "a"}, ("names", "Input should be a valid list", "a")),
        ({"names": ["a", ""]}, ("names", "String should have at least 1 character", "")),
        ({"names": ["a", 3]}, ("names", "Input should be a valid string", 3)),
        ({"innerBlock": []}, ("innerBlock", "Input should be a valid dictionary", [])),
        ({"innerBlock": {"on": 1}}, ("innerBlock.on", "Input should be a valid boolean", 1)),
        ({"innerBlock": {"on": "true"}}, ("innerBlock.on", "Input should be a valid boolean", "true")),
        ({"mtu": "9000"}, ("mtu", "Input should be a valid integer", "9000")),
    ],
)
def test_values_are_taken_as_json_types_with_no_coercion(raw: dict[str, Any], want: tuple) -> None:
    assert problem(raw) == want


def test_null_is_absent_only_where_the_key_is_optional() -> None:
    assert outer({"mtu": None}).mtu is None
    assert outer({"mtu": 9000, "innerBlock": {"on": True}}) == Outer(mtu=9000, inner=Inner(on=True))


def test_a_key_is_read_by_its_json_name_first_then_its_attribute_name_and_named_as_written() -> None:
    assert outer({"inner": {"on": True}}).inner.on is True
    assert outer({"innerBlock": {"on": True}, "inner": {"on": False}}).inner.on is True
    with pytest.raises(cf.Invalid) as exc:
        outer({"inner": {"on": 0}})
    assert exc.value.key == "inner.on"


def test_choices_and_either_say_what_would_be_taken() -> None:
    check = cf.one_of("l2", "l3", "l3s")
    assert check("l3") == "l3"
    for bad in ("l4", ["l2"], None, 2):
        with pytest.raises(cf.Invalid) as exc:
            check(bad)
        assert exc.value.problem == "Input should be 'l2', 'l3' or 'l3s'"
    host_or_index = cf.either(cf.one_of("host"), cf.integer(), "Input should be 'host' or a valid integer")
    assert host_or_index("host") == "host" and host_or_index(3) == 3
    with pytest.raises(cf.Invalid, match="'host' or a valid integer"):
        host_or_index("3")


def test_a_bad_value_inside_an_object_of_values_is_named_by_its_key() -> None:
    check = cf.dict_of(cf.string())
    assert check({"bond0": "x"}) == {"bond0": "x"}
    with pytest.raises(cf.Invalid) as exc:
        check({"bond0": "x", "bond1": 5})
    assert exc.value.key == "bond1" and exc.value.got == 5


# The plugins' configs, read end to end: what the pydantic models took and refused, they take and refuse.
@pytest.mark.parametrize(
    "raw,key",
    [
        ({"count": "2"}, "count"),
        ({"count": 65}, "count"),
        ({"mode": "Bridge"}, "mode"),
        ({"mtu": 67}, "mtu"),
        ({"podIfName": "eth"}, "podIfName"),
        ({"ipam": "host-local"}, "ipam"),
        ({"rdma": {"gidIndex": "3"}}, "rdma.gidIndex"),
        ({"rdma": {"gidIndex": 65536}}, "rdma.gidIndex"),
        ({"rdma": {"gidTimeoutMs": -1}}, "rdma.gidTimeoutMs"),
        ({"rdma": {"netnsMode": "private"}}, "rdma.netnsMode"),
        ({"runDir": ""}, "runDir"),
        ({"logLevel": "trace"}, "logLevel"),
        ({"name": 1}, "name"),
    ],
)
def test_rdma_macvlan_refuses_each_bad_key_with_error_7_naming_it_and_its_fix(raw: dict, key: str) -> None:
    with pytest.raises(CniError) as exc:
        parse_config({"masters": ["bond0"], **raw})
    assert exc.value.code == 7 and f"config key '{key}'" in exc.value.msg, exc.value.msg
    assert ": use " in exc.value.msg or "out of range" in exc.value.msg, exc.value.msg


def test_rdma_macvlan_reads_a_full_config() -> None:
    cfg = parse_config({
        "masters": ["bond0", "bond1"], "count": 2, "mode": "passthru", "mtu": 9000, "podIfName": "cni",
        "ipam": {"type": "host-local"}, "rdma": {"netnsMode": "exclusive", "required": False, "gidIndex": 3,
                                                 "gidTimeoutMs": 0},
        "dataDir": "/d", "runDir": "/r", "sysfsRoot": "/s", "logFile": "", "logLevel": "debug",
    })
    assert (cfg.masters, cfg.count, cfg.mode, cfg.mtu, cfg.pod_if_name) == (["bond0", "bond1"], 2, "passthru",
                                                                           9000, "cni")
    assert (cfg.rdma.netns_mode, cfg.rdma.required, cfg.rdma.gid_index, cfg.rdma.gid_timeout_ms) == (
        "exclusive", False, 3, 0)
    assert (cfg.data_dir, cfg.run_dir, cfg.sysfs_root, cfg.log_file, cfg.log_level) == ("/d", "/r", "/s", "",
                                                                                       "debug")


def test_del_drops_a_bad_key_given_by_its_attribute_name_but_never_a_bad_data_dir() -> None:
    cfg, dropped = parse_del_config({"pod_if_name": 5, "rdma": {"gid_index": "x", "required": False}})
    assert cfg.pod_if_name == "master" and cfg.rdma.gid_index == "host" and cfg.rdma.required is False
    assert len(dropped) == 2 and "'pod_if_name'" in dropped[0] and "'rdma.gid_index'" in dropped[1]
    for raw in ({"dataDir": ""}, {"data_dir": ""}, {"dataDir": 3}):
        with pytest.raises(CniError) as exc:
            parse_del_config(raw)
        assert exc.value.code == 7
        with pytest.raises(CniError):
            ipvlan_del_config(raw)


@pytest.mark.parametrize(
    "raw,key",
    [
        ({"link": "bridge"}, "link"),
        ({"ipvlanMode": "l4"}, "ipvlanMode"),
        ({"ranges": ["198.51.100.4"]}, "ranges"),
        ({"ranges": {"bond0": 4}}, "ranges.bond0"),
        ({"ranges": {"bond0": ["198.51.100.4", None]}}, "ranges.bond0"),
        ({"exclude": "198.51.100.9"}, "exclude"),
        ({"exclude": [9]}, "exclude"),
        ({"rdma": {"required": "yes"}}, "rdma.required"),
        ({"mtu": 70000}, "mtu"),
    ],
)
def test_rdma_ipvlan_refuses_each_bad_key_with_error_7_naming_it(raw: dict, key: str) -> None:
    with pytest.raises(CniError) as exc:
        ipvlan_config({"masters": ["bond0"], **raw})
    assert exc.value.code == 7 and f"config key '{key}'" in exc.value.msg, exc.value.msg


def test_rdma_ipvlan_reads_ranges_as_one_range_or_a_list() -> None:
    cfg, pools = ipvlan_config({"ranges": {"bond0": "198.51.100.4-198.51.100.9",
                                           "bond1": ["203.0.113.4-203.0.113.5", "203.0.113.9"]},
                                "exclude": ["198.51.100.6"], "link": "macvlan", "ipvlanMode": "l3s"})
    assert cfg.link == "macvlan" and cfg.ipvlan_mode == "l3s"
    assert [len(pools.ranges[b]) for b in ("bond0", "bond1")] == [1, 2] and len(pools.exclude) == 1
