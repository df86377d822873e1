"""The cold path imports only what a verb needs: VERSION and STATUS start without pyroute2, pydantic
or click (issue 7); ADD needs pyroute2's message codecs at most, never pyroute2's IPRoute, its
asyncio core or its package ``__init__``. No verb imports pydantic since issue 20 (the config model
is :mod:`rdma_cni.cni.config_fields`'s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from netns import Node, policy_env

REPO = str(Path(__file__).resolve().parents[3])

RUN = """
import json, sys
from rdma_cni.cli.macvlan import SPEC
from rdma_cni.cni import dispatch
out, code = dispatch.run(json.loads(sys.argv[1]), sys.argv[2].encode(), SPEC)
heavy = ("pyroute2", "pydantic", "click", "asyncio", "pyroute2.iproute", "pyroute2.ndb")
loaded = sorted({h for h in heavy for m in sys.modules if m == h or m.startswith(h + ".")})
print(json.dumps({"code": code, "out": out, "loaded": loaded}))
"""


def run_verb(command: str, tmp: str, master: str, netns: str) -> dict[str, object]:
    """The verb in a fresh interpreter inside ``netns`` (in-process here, the plugin would set up
    logging for good)."""
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "rdma-macvlan", "masters": [master],
            "dataDir": os.path.join(tmp, "data"), "runDir": os.path.join(tmp, "run"), "logFile": "",
            "rdma": {"required": False}}
    env = {"CNI_COMMAND": command, **policy_env(), "CNI_PATH": "/usr/lib/cni"}
    proc = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", RUN, json.dumps(env),
                           json.dumps(conf)], capture_output=True, text=True, cwd="/",
                          env={**os.environ, "PYTHONPATH": REPO, "RDMA_CNI_AGENT": "off"}, check=True)
    result: dict[str, object] = json.loads(proc.stdout)
    return result


@pytest.mark.netns
@pytest.mark.parametrize("command", ["VERSION", "STATUS"])
def test_version_and_status_load_no_netlink_library_no_pydantic_no_click(command: str, node_ns: Node) -> None:
    node_ns.bond("bond0", "198.51.100.2/28")
    got = run_verb(command, node_ns.tmp, "bond0", node_ns.name)
    assert got["loaded"] == [], got
    assert got["code"] == 0, got  # STATUS: bond0 holds 198.51.100.2, an address ADD could move


@pytest.mark.netns
def test_status_is_not_ready_for_a_master_without_a_movable_address(node_ns: Node) -> None:
    node_ns.bond("bond0")  # up, so only its IPv6 link-local, which ADD never moves
    got = run_verb("STATUS", node_ns.tmp, "bond0", node_ns.name)
    assert got["code"] == 1, got
    assert json.loads(str(got["out"]))["code"] == 50 and "bond0 holds no IP address" in str(got["out"])


GOOD = {"cniVersion": "1.1.0", "name": "n", "type": "rdma-macvlan", "masters": ["bond0"]}
# Each key STATUS reads, broken the ways a config gets broken; the full model must agree.
BROKEN = [
    ("masters", "bond0"), ("masters", []), ("masters", [1]), ("masters", ["a/b"]), ("masters", [""]),
    ("dataDir", ""), ("dataDir", 5), ("sysfsRoot", ""), ("sysfsRoot", None), ("logFile", 3),
    ("logLevel", "loud"), ("logLevel", 1), ("ipam", {"subnet": "x"}), ("ipam", {"type": 1}),
    ("rdma", "yes"), ("rdma", {"netnsMode": "private"}), ("rdma", {"netnsMode": ["shared"]}),
]


@pytest.mark.parametrize("key,value", BROKEN)
def test_status_and_the_full_model_refuse_the_same_keys_naming_the_same_key(key: str, value: object) -> None:
    from rdma_cni.cni.errors import CniError
    from rdma_cni.delegate_config import parse_status_config
    from rdma_cni.plugins.macvlan.config import parse_config
    from rdma_cni.plugins.macvlan.model import DEFAULT_DATA_DIR

    raw = dict(GOOD, **{key: value})
    with pytest.raises(CniError) as light:
        parse_status_config(raw, DEFAULT_DATA_DIR)
    with pytest.raises(CniError) as full:
        parse_config(raw)
    assert light.value.code == full.value.code == 7
    named = key if key != "rdma" or not isinstance(value, dict) else "rdma.netnsMode"
    assert f"'{named}" in light.value.msg and f"'{named}" in full.value.msg, (light.value.msg, full.value.msg)


def test_status_and_the_full_model_read_a_good_config_alike() -> None:
    from rdma_cni.delegate_config import parse_status_config
    from rdma_cni.plugins.macvlan.config import parse_config
    from rdma_cni.plugins.macvlan.model import DEFAULT_DATA_DIR

    raw = dict(GOOD, dataDir="/d", sysfsRoot="/s", logFile="", logLevel="debug", ipam={"type": "host-local"},
               rdma={"netnsMode": "exclusive", "required": False})
    light, full = parse_status_config(raw, DEFAULT_DATA_DIR), parse_config(raw)
    for field in ("masters", "data_dir", "sysfs_root", "ipam", "log_file", "log_level"):
        assert getattr(light, field) == getattr(full, field), field
    assert light.rdma.netns_mode == full.rdma.netns_mode
    defaults_light, defaults_full = parse_status_config({}, DEFAULT_DATA_DIR), parse_config({})
    for field in ("masters", "data_dir", "sysfs_root", "ipam", "log_file", "log_level"):
        assert getattr(defaults_light, field) == getattr(defaults_full, field), field


# ``stdlib``: standard modules a cold ADD/DEL imported once and does not need, with their import CPU
# (python -X importtime): secrets (hmac, OpenSSL's _hashlib) ~7 ms for a temp link name; tempfile
# (shutil, bz2, lzma, random) ~4 ms for the atomic write; subprocess ~4 ms, only for an IPAM
# delegate or the `rdma` tool; urllib.parse ~3 ms for quoting a file name.
ADD_DEL = """
import json, sys
from rdma_cni.cli.macvlan import SPEC
from rdma_cni.cni import dispatch
env, conf = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out, code = dispatch.run(env, json.dumps(conf).encode(), SPEC)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pyroute2", "pydantic"))
costly = ("secrets", "hashlib", "tempfile", "shutil", "subprocess", "urllib")
stdlib = sorted(m for m in sys.modules if m.split(".")[0] in costly)
print(json.dumps({"code": code, "out": out, "loaded": loaded, "stdlib": stdlib}))
"""


@pytest.mark.netns
def test_a_cold_add_and_del_of_an_ordinary_bond_load_no_pyroute2_at_all(node_ns: Node) -> None:
    """Addresses, routes and rules of an ordinary bond are encoded and decoded by rtcodec: a cold
    ADD/DEL (the fallback when no agent answers) imports none of pyroute2 (its message classes cost
    a cold start ~30 ms and every message ~0.1-0.2 ms) and no pydantic (its import and the model's
    schema were ~250 ms of CPU), yet moves the IPv4 and IPv6 addresses, the bond's route, and gives
    them back. Nor does it import the costly standard modules it no longer needs (see ``ADD_DEL``)."""
    node_ns.bond("bond0", "198.51.100.2/28", "2001:db8:7::2/64 nodad")
    node_ns.ip("route", "add", "203.0.113.0/24", "via", "198.51.100.1", "dev", "bond0")
    before = node_ns.snapshot()
    pod = node_ns.pod()
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "rdma-macvlan", "masters": ["bond0"],
            "dataDir": os.path.join(node_ns.tmp, "data"), "runDir": os.path.join(node_ns.tmp, "run"),
            "logFile": "", "rdma": {"required": False}}
    env = {"CNI_CONTAINERID": "cold1", "CNI_NETNS": pod.path, "CNI_IFNAME": "net1",
           "CNI_PATH": "/usr/lib/cni"}

    def verb(command: str, stdin: dict[str, object]) -> dict[str, object]:
        proc = subprocess.run(
            ["ip", "netns", "exec", node_ns.name, sys.executable, "-c", ADD_DEL,
             json.dumps(dict(env, CNI_COMMAND=command)), json.dumps(stdin)],
            capture_output=True, text=True, cwd="/", check=True,
            env={**os.environ, "PYTHONPATH": REPO, "RDMA_CNI_AGENT": "off"},
        )
        result: dict[str, object] = json.loads(proc.stdout)
        return result

    added = verb("ADD", conf)
    assert added["code"] == 0, added
    assert added["loaded"] == [] and added["stdlib"] == [], added
    ips = {ip["address"] for ip in json.loads(str(added["out"]))["ips"]}
    assert ips == {"198.51.100.2/28", "2001:db8:7::2/64"}
    assert any(r.get("dst") == "203.0.113.0/24" for r in node_ns.pod_json(pod, "route", "show"))
    deleted = verb("DEL", dict(conf, prevResult=json.loads(str(added["out"]))))
    assert deleted["code"] == 0 and deleted["loaded"] == [] and deleted["stdlib"] == [], deleted
    assert node_ns.snapshot() == before
