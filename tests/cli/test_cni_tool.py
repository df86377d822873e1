"""cni-tool's runtime behaviour, with recording plugins (real executables run by the protocol).

Each fake plugin appends what it was run with (command, CNI_* env, stdin) to a log and answers ADD
by appending an interface named after itself to its prevResult, so the order of the chain, what
each plugin got as prevResult and runtimeConfig, and what was cached are all observable.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from rdma_cni.cli.tool import LAZY_COMMANDS, LazyGroup, absolute_netns, cli, container_id_for
from rdma_cni.cni.cache import CacheEntry, ResultCache

NETNS = "/var/run/netns/h1-fake"
CID = container_id_for(NETNS)

PLUGIN = r"""#!{python} -IS
import json, os, sys
stdin = sys.stdin.read()
conf = json.loads(stdin)
me = os.path.basename(sys.argv[0])
env = {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}
with open(os.environ["H1_LOG"], "a") as log:
    log.write(json.dumps({{"plugin": me, "env": env, "conf": conf}}) + "\n")
cmd = env["CNI_COMMAND"]
if conf.get("failOn") == cmd:
    print(json.dumps({{"cniVersion": conf["cniVersion"], "code": conf.get("failCode", 107),
                      "msg": me + " refuses " + cmd}}))
    sys.exit(1)
if cmd == "ADD":
    prev = conf.get("prevResult") or {{"cniVersion": conf["cniVersion"], "dns": {{}}}}
    res = dict(prev)
    iface = {{"name": me}} if conf.get("noSandbox") else {{"name": me, "sandbox": env["CNI_NETNS"]}}
    res["interfaces"] = list(prev.get("interfaces", [])) + [iface]
    if me == "rec-a":
        res["ips"] = [{{"interface": 0, "address": "198.51.100.7/24"}}]
    print(json.dumps(res))
"""


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.netconf = tmp / "net.d"
        self.cache = tmp / "cache"
        self.log = tmp / "calls.log"
        self.bin.mkdir()
        self.netconf.mkdir()
        script = PLUGIN.format(python=sys.executable)
        for name in ("rec-a", "rec-b", "rec-c"):
            path = self.bin / name
            path.write_text(script)
            path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def write_list(
        self,
        plugins: list[dict[str, Any]],
        name: str = "h1chain",
        version: str = "1.0.0",
        filename: str = "10-h1.conflist",
        **extra: Any,
    ) -> bytes:
        data = json.dumps(
            {"cniVersion": version, "name": name, **extra, "plugins": plugins}, indent=2
        ).encode()
        (self.netconf / filename).write_bytes(data)
        return data

    def run(self, *args: str, **env: str) -> Result:
        full = {
            "NETCONFPATH": str(self.netconf),
            "CNI_PATH": str(self.bin),
            "H1_LOG": str(self.log),
            "CNI_ARGS": "",
            "CAP_ARGS": "",
            "CNI_IFNAME": "",
            "CNI_TOOL_CACHE_DIR": str(self.cache),
        }
        full.update(env)
        return CliRunner().invoke(cli, list(args), env=full, catch_exceptions=False)

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        calls = [json.loads(line) for line in self.log.read_text().splitlines()]
        self.log.unlink()
        return calls

    def cached(self, network: str = "h1chain", ifname: str = "eth0") -> CacheEntry | None:
        return ResultCache(str(self.cache)).read(network, CID, ifname)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield Env(tmp_path)


ABC = [{"type": "rec-a"}, {"type": "rec-b", "name": "ignored", "cniVersion": "0.3.0"}, {"type": "rec-c"}]


def test_add_chains_plugins_in_order_and_caches_the_last_result(env: Env) -> None:
    raw = env.write_list(ABC)
    res = env.run("add", "h1chain", NETNS, CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAME=p1")
    assert res.exit_code == 0, res.output
    calls = env.calls()
    assert [(c["plugin"], c["env"]["CNI_COMMAND"]) for c in calls] == [
        ("rec-a", "ADD"),
        ("rec-b", "ADD"),
        ("rec-c", "ADD"),
    ]
    for c in calls:
        assert c["env"]["CNI_CONTAINERID"] == CID and CID.startswith("cnitool-") and len(CID) == 28
        assert c["env"]["CNI_NETNS"] == NETNS and c["env"]["CNI_IFNAME"] == "eth0"
        assert c["env"]["CNI_PATH"] == str(env.bin)
        assert c["env"]["CNI_ARGS"] == "IgnoreUnknown=1;K8S_POD_NAME=p1"
        # the list's name and version are forced into every plugin's config
        assert c["conf"]["name"] == "h1chain" and c["conf"]["cniVersion"] == "1.0.0"
    assert "prevResult" not in calls[0]["conf"]
    assert [i["name"] for i in calls[1]["conf"]["prevResult"]["interfaces"]] == ["rec-a"]
    assert [i["name"] for i in calls[2]["conf"]["prevResult"]["interfaces"]] == ["rec-a", "rec-b"]
    printed = json.loads(res.stdout)
    assert [i["name"] for i in printed["interfaces"]] == ["rec-a", "rec-b", "rec-c"]

    path = env.cache / "results" / f"h1chain-{CID}-eth0"
    on_disk = json.loads(path.read_bytes())
    assert on_disk["kind"] == "cniCacheV1" and on_disk["containerId"] == CID and on_disk["ifName"] == "eth0"
    assert base64.b64decode(on_disk["config"]) == raw, "the conflist's bytes, as libcni caches them"
    assert on_disk["cniArgs"] == [["IgnoreUnknown", "1"], ["K8S_POD_NAME", "p1"]]
    assert on_disk["netns"] == NETNS and on_disk["result"] == printed
    assert "capabilityArgs" not in on_disk
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_check_in_order_and_del_in_reverse_with_cached_prev_result(env: Env) -> None:
    env.write_list(ABC)
    assert env.run("add", "h1chain", NETNS).exit_code == 0
    added = env.cached()
    assert added is not None and added.result is not None
    env.calls()
    res = env.run("check", "h1chain", NETNS)
    assert res.exit_code == 0, res.output
    calls = env.calls()
    assert [(c["plugin"], c["env"]["CNI_COMMAND"]) for c in calls] == [
        ("rec-a", "CHECK"),
        ("rec-b", "CHECK"),
        ("rec-c", "CHECK"),
    ]
    assert all(c["conf"]["prevResult"] == added.result for c in calls)
    res = env.run("del", "h1chain", NETNS)
    assert res.exit_code == 0, res.output
    calls = env.calls()
    assert [(c["plugin"], c["env"]["CNI_COMMAND"]) for c in calls] == [
        ("rec-c", "DEL"),
        ("rec-b", "DEL"),
        ("rec-a", "DEL"),
    ]
    assert all(c["conf"]["prevResult"] == added.result for c in calls)
    assert env.cached() is None
    # DEL again: nothing cached, plugins still called (idempotent teardown), no prevResult
    assert env.run("del", "h1chain", NETNS).exit_code == 0
    assert all("prevResult" not in c["conf"] for c in env.calls())


def test_cached_result_is_converted_to_the_list_version(env: Env) -> None:
    env.write_list([{"type": "rec-a"}], version="0.4.0")
    assert env.run("add", "h1chain", NETNS).exit_code == 0
    entry = env.cached()
    assert entry is not None and entry.result is not None
    entry.result = {
        "cniVersion": "1.0.0",
        "ips": [{"address": "198.51.100.7/24", "interface": 0}],
        "interfaces": [{"name": "eth0"}],
        "dns": {},
    }
    ResultCache(str(env.cache)).write(entry)
    env.calls()
    assert env.run("check", "h1chain", NETNS).exit_code == 0
    [call] = env.calls()
    assert call["conf"]["prevResult"]["cniVersion"] == "0.4.0"
    assert call["conf"]["prevResult"]["ips"] == [
        {"version": "4", "interface": 0, "address": "198.51.100.7/24"}
    ]


def test_cap_args_reach_only_plugins_declaring_the_capability(env: Env) -> None:
    env.write_list(
        [
            {"type": "rec-a", "capabilities": {"mac": True, "ips": False}},
            {"type": "rec-b", "capabilities": {"portMappings": True}, "runtimeConfig": {"stale": 1}},
            {"type": "rec-c", "runtimeConfig": {"keep": 1}},
        ]
    )
    cap = {"mac": "02:00:00:00:00:42", "ips": ["198.51.100.9/24"], "portMappings": [{"hostPort": 80}]}
    res = env.run("add", "h1chain", NETNS, CAP_ARGS=json.dumps(cap))
    assert res.exit_code == 0, res.output
    a, b, c = env.calls()
    assert a["conf"]["runtimeConfig"] == {"mac": "02:00:00:00:00:42"}, "ips is declared false"
    assert b["conf"]["runtimeConfig"] == {"portMappings": [{"hostPort": 80}]}, "replaced, as libcni does"
    assert c["conf"]["runtimeConfig"] == {"keep": 1}, "no capability matched: config left as written"
    entry = env.cached()
    assert entry is not None and entry.capability_args == cap


def test_ifname_option_env_and_relative_netns(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.write_list([{"type": "rec-a"}])
    assert env.run("add", "h1chain", NETNS, CNI_IFNAME="net3").exit_code == 0
    assert env.calls()[0]["env"]["CNI_IFNAME"] == "net3"
    assert env.run("add", "h1chain", NETNS, "--ifname", "net4", CNI_IFNAME="net3").exit_code == 0
    assert env.calls()[0]["env"]["CNI_IFNAME"] == "net4"
    assert sorted(p.name for p in (env.cache / "results").iterdir()) == [
        f"h1chain-{CID}-net3",
        f"h1chain-{CID}-net4",
    ]
    monkeypatch.chdir(tmp_path)
    assert env.run("add", "h1chain", "./pods/../ns1", "-i", "net5").exit_code == 0
    call = env.calls()[0]["env"]
    assert call["CNI_NETNS"] == f"{tmp_path}/ns1"
    assert call["CNI_CONTAINERID"] == container_id_for(f"{tmp_path}/ns1")


def test_absolute_netns_cleans_like_go() -> None:
    assert absolute_netns("//var/run//netns/x/") == "/var/run/netns/x"
    assert absolute_netns("/a/./b/../c") == "/a/c"
    # sha512("/var/run/netns/x")[:10 bytes], as cnitool prints it
    import hashlib

    assert (
        container_id_for("/var/run/netns/x")
        == "cnitool-" + hashlib.sha512(b"/var/run/netns/x").digest()[:10].hex()
    )


def test_failing_plugin_stops_the_chain_with_an_actionable_message(env: Env) -> None:
    env.write_list([{"type": "rec-a"}, {"type": "rec-b", "failOn": "ADD", "failCode": 11}, {"type": "rec-c"}])
    res = env.run("add", "h1chain", NETNS)
    assert res.exit_code == 1
    assert [c["plugin"] for c in env.calls()] == ["rec-a", "rec-b"], "rec-c never ran"
    assert "plugin type='rec-b' failed (add): rec-b: rec-b refuses ADD (CNI error code 11)" in res.stderr
    assert f"cni-tool del h1chain {NETNS} --ifname eth0" in res.stderr
    assert "Traceback" not in res.output and res.stdout == ""
    assert env.cached() is None, "a failed ADD caches nothing"


def test_del_failure_is_reported_and_keeps_the_cache(env: Env) -> None:
    env.write_list([{"type": "rec-a"}, {"type": "rec-b"}])
    assert env.run("add", "h1chain", NETNS).exit_code == 0
    env.write_list([{"type": "rec-a"}, {"type": "rec-b", "failOn": "DEL"}])
    res = env.run("del", "h1chain", NETNS)
    assert res.exit_code == 1 and "plugin type='rec-b' failed (delete)" in res.stderr
    assert env.cached() is not None, "kept so a retry still has prevResult"


def test_check_version_gate_and_disable_check(env: Env) -> None:
    env.write_list([{"type": "rec-a"}], version="0.3.1")
    res = env.run("check", "h1chain", NETNS)
    assert res.exit_code == 1 and "does not support CHECK" in res.stderr and "0.3.1" in res.stderr
    assert env.calls() == []
    env.write_list([{"type": "rec-a"}], disableCheck="true")
    res = env.run("check", "h1chain", NETNS)
    assert res.exit_code == 0 and "disableCheck" in res.stderr and env.calls() == []


def test_del_uses_cached_config_when_the_network_file_is_gone(env: Env) -> None:
    env.write_list([{"type": "rec-a"}, {"type": "rec-b"}])
    assert env.run("add", "h1chain", NETNS).exit_code == 0
    env.calls()
    (env.netconf / "10-h1.conflist").unlink()
    env.write_list([{"type": "rec-c"}], name="other", filename="20-other.conflist")
    res = env.run("del", "h1chain", NETNS)
    assert res.exit_code == 0, res.output
    assert "using the config cached at ADD" in res.stderr
    assert [c["plugin"] for c in env.calls()] == ["rec-b", "rec-a"]
    assert env.cached() is None


@pytest.mark.parametrize("breakage", ["no-dir", "broken-file"])
def test_del_uses_cached_config_when_the_config_dir_is_unusable(env: Env, breakage: str) -> None:
    env.write_list([{"type": "rec-a"}])
    assert env.run("add", "h1chain", NETNS).exit_code == 0
    env.calls()
    over = {"NETCONFPATH": str(env.tmp / "gone")} if breakage == "no-dir" else {}
    if breakage == "broken-file":
        (env.netconf / "00-broken.conflist").write_text("{")
    res = env.run("del", "h1chain", NETNS, **over)
    assert res.exit_code == 0, res.output
    assert "using the config cached at ADD" in res.stderr
    assert [c["plugin"] for c in env.calls()] == ["rec-a"] and env.cached() is None
    # without a cache entry there is nothing to fall back to: the load error is reported
    res = env.run("del", "h1chain", NETNS, **over)
    assert res.exit_code == 1 and "Traceback" not in res.output and env.calls() == []


def test_corrupt_cache_never_blocks_del(env: Env) -> None:
    env.write_list([{"type": "rec-a"}])
    (env.cache / "results").mkdir(parents=True)
    (env.cache / "results" / f"h1chain-{CID}-eth0").write_text("{garbage")
    res = env.run("check", "h1chain", NETNS)
    assert res.exit_code == 1 and "not valid JSON" in res.stderr and "108" in res.stderr
    res = env.run("del", "h1chain", NETNS)
    assert res.exit_code == 0, res.output
    assert "prevResult" not in env.calls()[0]["conf"]
    assert not (env.cache / "results" / f"h1chain-{CID}-eth0").exists()


@pytest.mark.parametrize(
    "setup, args, env_over, message",
    [
        (
            "none",
            ["add", "h1chain", NETNS],
            {"NETCONFPATH": "/nonexistent/h1"},
            "NETCONFPATH /nonexistent/h1 is not",
        ),
        ("empty", ["add", "h1chain", NETNS], {}, "no network configs (*.conflist, *.conf, *.json) in"),
        ("other", ["add", "h1chain", NETNS], {}, "no network named 'h1chain' in"),
        ("broken", ["add", "h1chain", NETNS], {}, "00-broken.conflist is not valid JSON"),
        ("ok", ["add", "h1chain", NETNS], {"CNI_ARGS": "A=1;B"}, "invalid CNI_ARGS pair 'B'"),
        ("ok", ["add", "h1chain", NETNS], {"CAP_ARGS": "{mac"}, "CAP_ARGS is not valid JSON"),
        ("ok", ["add", "h1chain", NETNS], {"CAP_ARGS": "[1]"}, "CAP_ARGS must be a JSON object"),
        ("ok", ["add", "h1chain", NETNS], {"CNI_PATH": "/nonexistent/h1"}, "plugin 'rec-a' not found in"),
        ("ok", ["add", "h1chain", NETNS, "-i", "eth/0"], {}, "CNI_IFNAME may not contain"),
        ("badname", ["add", "bad name", NETNS], {}, "'name' has invalid characters"),
    ],
)
def test_bad_setup_gives_one_clear_line(
    env: Env, setup: str, args: list[str], env_over: dict[str, str], message: str
) -> None:
    if setup in ("other", "broken", "ok"):
        env.write_list([{"type": "rec-a"}], name="elsewhere" if setup == "other" else "h1chain")
    if setup == "broken":
        (env.netconf / "00-broken.conflist").write_text("{")
    if setup == "badname":
        env.write_list([{"type": "rec-a"}], name="bad name")
    res = env.run(*args, **env_over)
    assert res.exit_code == 1, res.output
    assert message in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("cni-tool: ")
    assert "Traceback" not in res.output and res.stdout == ""
    assert "undo" not in res.stderr, "nothing ran, so there is nothing to undo"
    if setup == "other":
        assert "found elsewhere" in res.stderr
    assert env.calls() == []


def test_gc_deletes_stale_attachments_and_sends_valid_list(env: Env) -> None:
    env.write_list([{"type": "rec-a"}, {"type": "rec-b"}], version="1.1.0")
    live = "/proc/self/ns/net"  # a live netns for as long as the test runs
    gone = "/var/run/netns/h1-gone-netns"
    assert env.run("add", "h1chain", live).exit_code == 0
    assert env.run("add", "h1chain", gone).exit_code == 0
    env.calls()
    res = env.run("gc", "h1chain")
    assert res.exit_code == 0, res.output
    assert f"deleted stale attachment {container_id_for(gone)} eth0 (netns {gone})" in res.stdout
    calls = env.calls()
    assert [(c["plugin"], c["env"]["CNI_COMMAND"]) for c in calls] == [
        ("rec-b", "DEL"),
        ("rec-a", "DEL"),
        ("rec-a", "GC"),
        ("rec-b", "GC"),
    ]
    assert calls[0]["env"]["CNI_CONTAINERID"] == container_id_for(gone)
    valid = [{"containerID": container_id_for(live), "ifname": "eth0"}]
    assert calls[2]["conf"]["cni.dev/valid-attachments"] == valid
    assert calls[2]["env"]["CNI_CONTAINERID"] == "" and calls[2]["env"]["CNI_IFNAME"] == ""
    assert [e.container_id for e in ResultCache(str(env.cache)).entries()] == [container_id_for(live)]
    res = env.run("gc", "h1chain", "--all")
    assert res.exit_code == 0, res.output
    assert list(ResultCache(str(env.cache)).entries()) == []


def test_gc_below_1_1_only_cleans_the_cache(env: Env) -> None:
    env.write_list([{"type": "rec-a"}], version="1.0.0")
    assert env.run("add", "h1chain", "/var/run/netns/h1-gone").exit_code == 0
    env.calls()
    assert env.run("gc", "h1chain", NETNS).exit_code == 0
    assert [c["env"]["CNI_COMMAND"] for c in env.calls()] == ["DEL"]


def test_status(env: Env) -> None:
    env.write_list([{"type": "rec-a"}, {"type": "rec-b"}], version="1.1.0")
    res = env.run("status", "h1chain")
    assert res.exit_code == 0 and res.stdout == "h1chain: ready\n"
    assert [(c["plugin"], c["env"]["CNI_COMMAND"], c["env"]["CNI_CONTAINERID"]) for c in env.calls()] == [
        ("rec-a", "STATUS", ""),
        ("rec-b", "STATUS", ""),
    ]
    env.write_list(
        [{"type": "rec-a", "failOn": "STATUS", "failCode": 50}, {"type": "rec-b"}], version="1.1.0"
    )
    res = env.run("status", "h1chain", NETNS)
    assert res.exit_code == 1 and "(CNI error code 50)" in res.stderr
    assert [c["plugin"] for c in env.calls()] == ["rec-a"]
    env.write_list([{"type": "rec-a"}], version="1.0.0")
    res = env.run("status", "h1chain")
    assert res.exit_code == 0 and "has no STATUS" in res.stdout and env.calls() == []


def test_lazy_commands_registry_and_missing_module(env: Env) -> None:
    assert LAZY_COMMANDS == {
        "gids": "rdma_cni.cli.tool_gids:gids",
        "doctor": "rdma_cni.cli.tool_doctor:doctor",
        "state": "rdma_cni.cli.tool_state:state",
        "held-claims": "rdma_cni.cli.tool_held_claims:held_claims",
    }
    group = LazyGroup(name="t", lazy={"ghost": "rdma_cni.cli.h1_no_such_module:cmd"})
    res = CliRunner().invoke(group, ["ghost", "--anything", "x"])
    assert res.exit_code == 1
    assert (
        "'ghost' is not available: rdma_cni.cli.h1_no_such_module:cmd is not part of this installation"
        in (res.output)
    )
    assert "Traceback" not in res.output
    listing = CliRunner().invoke(group, ["--help"])
    assert listing.exit_code == 0 and "ghost" in listing.output and "not available" in listing.output


def test_version_is_fast_path(env: Env) -> None:
    res = env.run("version")
    assert res.exit_code == 0 and "0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0" in res.stdout
    # importing the CLI must not pull in the chain runtime or netlink: version stays cheap
    import subprocess

    code = (
        "import sys, rdma_cni.cli.tool as t; "
        "heavy = ('pyroute2', 'pydantic', 'rdma_cni.cni.chain'); "
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert os.access(sys.executable, os.X_OK)


def test_cache_write_failure_after_plugins_ran_says_so(env: Env) -> None:
    env.write_list([{"type": "rec-a"}])
    blocker = env.tmp / "not-a-dir"
    blocker.write_text("")
    res = env.run("--cache-dir", str(blocker), "add", "h1chain", NETNS)
    assert res.exit_code == 1
    assert "the network was added but its result could not be cached" in res.stderr
    assert f"cni-tool del h1chain {NETNS}" in res.stderr and "Traceback" not in res.output
    assert [c["plugin"] for c in env.calls()] == ["rec-a"]


def _libcni_1_1_entry(env: Env, container_id: str, sandbox: str | None, ifname: str = "eth0") -> None:
    """A cache file as Debian's libcni 1.1.2 (cnitool, containerd 1.6) writes it: no ``netns`` key."""
    result: dict[str, Any] = {"cniVersion": "1.1.0", "interfaces": [{"name": ifname}], "dns": {}}
    if sandbox is not None:
        result["interfaces"][0]["sandbox"] = sandbox
    (env.cache / "results").mkdir(parents=True, exist_ok=True)
    data = {
        "kind": "cniCacheV1",
        "containerId": container_id,
        "config": base64.b64encode((env.netconf / "10-h1.conflist").read_bytes()).decode(),
        "ifName": ifname,
        "networkName": "h1chain",
        "result": result,
    }
    (env.cache / "results" / f"h1chain-{container_id}-{ifname}").write_text(json.dumps(data))


@pytest.fixture
def live_netns() -> Iterator[str]:
    """A real named netns (``ip netns add``): a bind mount under /run/netns, as cnitool users make."""
    import subprocess
    import uuid

    if os.geteuid() != 0:
        pytest.skip("needs root for a network namespace")
    name = f"h11-gc-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def test_gc_of_a_libcni_1_1_cache_without_netns(env: Env, live_netns: str) -> None:
    """Entries without a netns (libcni < 1.2) are judged by the sandbox their plugins reported, else
    by their cnitool ID (hash of the netns path) against every existing netns path; anything else
    cannot be told and is kept, counted on stderr, until ``--all``."""
    env.write_list([{"type": "rec-a"}], version="1.1.0")
    gone = "/var/run/netns/h11-gone-netns"
    live_var, live_run = f"/var/run/netns/{live_netns}", f"/run/netns/{live_netns}"
    _libcni_1_1_entry(env, container_id_for(gone), None)  # cnitool ID, netns gone -> stale
    _libcni_1_1_entry(env, container_id_for(live_var), None)  # both spellings of a live netns: kept
    _libcni_1_1_entry(env, container_id_for(live_run), None, ifname="net1")
    _libcni_1_1_entry(env, "runtime-ctr-gone", gone)  # a runtime's ID, its sandbox gone -> stale
    _libcni_1_1_entry(env, "runtime-ctr-live", live_run)  # its sandbox live -> kept
    _libcni_1_1_entry(env, "runtime-ctr-unknown", None)  # nothing to go by -> kept and counted
    res = env.run("gc", "h1chain")
    assert res.exit_code == 0, res.output
    deleted = sorted(line.split()[3] for line in res.stdout.splitlines() if line.startswith("deleted"))
    assert deleted == sorted([container_id_for(gone), "runtime-ctr-gone"])
    assert f"no netns recorded; its result's sandbox {gone}" in res.stdout
    assert "no netns path hashes to its cnitool ID" in res.stdout
    assert "kept attachment runtime-ctr-unknown eth0: liveness unknown" in res.stdout
    assert "kept 1 attachment(s) of h1chain" in res.stderr and "--all" in res.stderr
    left = sorted((e.container_id, e.ifname) for e in ResultCache(str(env.cache)).entries())
    assert left == sorted(
        [
            (container_id_for(live_var), "eth0"),
            (container_id_for(live_run), "net1"),
            ("runtime-ctr-live", "eth0"),
            ("runtime-ctr-unknown", "eth0"),
        ]
    )
    gc_call = next(c for c in env.calls() if c["env"]["CNI_COMMAND"] == "GC")
    assert sorted(a["containerID"] for a in gc_call["conf"]["cni.dev/valid-attachments"]) == sorted(
        cid for cid, _ in left
    )
    res = env.run("gc", "h1chain", "--all")
    assert res.exit_code == 0, res.output
    assert "kept" not in res.output
    assert list(ResultCache(str(env.cache)).entries()) == []


def test_gc_keeps_a_cnitool_attachment_whose_netns_is_a_running_process(env: Env) -> None:
    """``cnitool add NET /proc/<pid>/ns/net`` without a recorded netns: live while the process runs."""
    import subprocess

    env.write_list([{"type": "rec-a"}], version="1.1.0")
    proc = subprocess.Popen(["sleep", "30"])
    path = f"/proc/{proc.pid}/ns/net"
    try:
        _libcni_1_1_entry(env, container_id_for(path), None)
        assert env.run("gc", "h1chain").exit_code == 0
        assert [e.container_id for e in ResultCache(str(env.cache)).entries()] == [container_id_for(path)]
    finally:
        proc.kill()
        proc.wait()
    res = env.run("gc", "h1chain")
    assert res.exit_code == 0, res.output
    assert f"deleted stale attachment {container_id_for(path)} eth0" in res.stdout
    assert list(ResultCache(str(env.cache)).entries()) == []


def test_gc_help_says_what_happens_to_entries_without_netns(env: Env) -> None:
    res = env.run("gc", "--help")
    assert "libcni < 1.2" in res.stdout and "KEPT" in res.stdout and "--all" in res.stdout


@pytest.fixture(scope="module")
def upstream_cnitool() -> str:
    """Upstream cnitool built from Debian's libcni 1.1.2 source (scripts/build-cnitool, cached)."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("needs root for network and mount namespaces")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [str(repo / "scripts" / "build-cnitool")], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        pytest.skip(f"upstream cnitool cannot be built here: {proc.stderr.strip()[-400:]}")
    return proc.stdout.strip().splitlines()[-1]


def test_gc_collects_what_real_cnitool_added_once_its_netns_is_gone(
    env: Env, upstream_cnitool: str, live_netns: str
) -> None:
    """The real case: Debian's cnitool ADDs (its cache has no netns, the plugin reports no sandbox),
    the netns of one pod is deleted, ``cni-tool gc`` DELs that one and keeps the other."""
    import subprocess
    import uuid

    env.write_list([{"type": "rec-a", "noSandbox": True}], version="1.0.0")  # libcni 1.1.2's newest
    doomed = f"h11-gc-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", doomed], check=True, capture_output=True)
    try:
        for name in (live_netns, doomed):
            # cnitool's cache dir is libcni's fixed /var/lib/cni: give it ours in a private mount ns
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
            cmd += ['mount --bind "$1" /var/lib/cni && shift && exec "$@"', "sh", str(env.cache)]
            cmd += [upstream_cnitool, "add", "h1chain", f"/var/run/netns/{name}"]
            full = {**os.environ, "NETCONFPATH": str(env.netconf), "CNI_PATH": str(env.bin)}
            full.update(H1_LOG=str(env.log), CNI_ARGS="", CAP_ARGS="")
            env.cache.mkdir(exist_ok=True)
            os.makedirs("/var/lib/cni", exist_ok=True)
            proc = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
    finally:
        subprocess.run(["ip", "netns", "del", doomed], check=False, capture_output=True)
    files = sorted((env.cache / "results").iterdir())
    assert len(files) == 2 and all("netns" not in json.loads(f.read_text()) for f in files)
    env.calls()
    res = env.run("gc", "h1chain")
    assert res.exit_code == 0, res.output
    gone_id = container_id_for(f"/var/run/netns/{doomed}")
    assert f"deleted stale attachment {gone_id} eth0" in res.stdout
    dels = [c["env"]["CNI_CONTAINERID"] for c in env.calls() if c["env"]["CNI_COMMAND"] == "DEL"]
    assert dels == [gone_id]
    kept = [e.container_id for e in ResultCache(str(env.cache)).entries()]
    assert kept == [container_id_for(f"/var/run/netns/{live_netns}")]
