"""The CNI protocol core through its one entry point, ``run(env, stdin, spec)``.

Every verb x every spec version with the exact JSON each version must print, the version gates
(CHECK >= 0.4.0, GC/STATUS >= 1.1.0), VERSION as podman sends it, the about text, error mapping
from the plugin, and a table of bad inputs each with the exact code and a message naming the field.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rdma_cni.cni.dispatch import INTERNAL_ERROR, run
from rdma_cni.cni.errors import CHECK_FAILED, STATUS_UNAVAILABLE, CniError
from rdma_cni.cni.plugin import PluginSpec
from rdma_cni.cni.request import MAX_STDIN, Request
from rdma_cni.cni.result import DNS, Interface, IPConfig, Result, Route

VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
ADD_ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c0ffee-1",
    "CNI_NETNS": "/var/run/netns/h1-test",
    "CNI_IFNAME": "eth0",
    "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
}
NO_ENV: tuple[str, ...] = ()


class RecordingPlugin:
    """A plugin that records each request and answers ADD with a result using every field."""

    calls: list[Request] = []
    fail: BaseException | None = None

    def _record(self, req: Request) -> None:
        RecordingPlugin.calls.append(req)
        if RecordingPlugin.fail is not None:
            raise RecordingPlugin.fail

    def add(self, req: Request) -> Result:
        self._record(req)
        return Result(
            interfaces=[
                Interface(
                    "bond0",
                    mac="02:00:00:00:00:01",
                    mtu=9000,
                    sandbox=req.netns,
                    socket_path="/run/x.sock",
                    pci_id="0000:3b:00.0",
                ),
            ],
            ips=[
                IPConfig("198.51.100.10/24", gateway="198.51.100.1", interface=0),
                IPConfig("2001:db8::10/64", interface=0),
            ],
            routes=[
                Route(
                    "203.0.113.0/24",
                    gw="198.51.100.1",
                    mtu=1500,
                    advmss=1460,
                    priority=10,
                    table=100,
                    scope=0,
                ),
                Route("0.0.0.0/0"),
            ],
            dns=DNS(
                nameservers=["198.51.100.53"], domain="example", search=["a.example"], options=["ndots:2"]
            ),
        )

    def delete(self, req: Request) -> None:
        self._record(req)

    def check(self, req: Request) -> None:
        self._record(req)

    def gc(self, req: Request) -> None:
        self._record(req)

    def status(self, req: Request) -> None:
        self._record(req)


SPEC = PluginSpec("h1-test", factory=RecordingPlugin, known_args=frozenset({"MAC"}), about="h1 test plugin")


@pytest.fixture(autouse=True)
def _reset() -> None:
    RecordingPlugin.calls = []
    RecordingPlugin.fail = None


def _conf(version: str, **extra: Any) -> bytes:
    return json.dumps({"cniVersion": version, "name": "rdma-net", "type": "h1-test", **extra}).encode()


def _env(command: str, **overrides: str | None) -> dict[str, str]:
    env = dict(ADD_ENV, CNI_COMMAND=command)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


# The exact result JSON per version: the spec's field differences, nothing else.
INTERFACE_PRE_11 = {"name": "bond0", "mac": "02:00:00:00:00:01", "sandbox": "/var/run/netns/h1-test"}
INTERFACE_11 = {
    "name": "bond0",
    "mac": "02:00:00:00:00:01",
    "mtu": 9000,
    "sandbox": "/var/run/netns/h1-test",
    "socketPath": "/run/x.sock",
    "pciID": "0000:3b:00.0",
}
IPS_LEGACY = [
    {"version": "4", "interface": 0, "address": "198.51.100.10/24", "gateway": "198.51.100.1"},
    {"version": "6", "interface": 0, "address": "2001:db8::10/64"},
]
IPS_1X = [
    {"interface": 0, "address": "198.51.100.10/24", "gateway": "198.51.100.1"},
    {"interface": 0, "address": "2001:db8::10/64"},
]
# Before 1.1 a route has no table field and reads as a main-table route, so the table-100 route is
# left out there (it is in the pod, in its own table; README "Routes in the pod").
ROUTES_PRE_11 = [{"dst": "0.0.0.0/0"}]
ROUTES_11 = [
    {
        "dst": "203.0.113.0/24",
        "gw": "198.51.100.1",
        "mtu": 1500,
        "advmss": 1460,
        "priority": 10,
        "table": 100,
        "scope": 0,
    },
    {"dst": "0.0.0.0/0"},
]
DNS_JSON = {
    "nameservers": ["198.51.100.53"],
    "domain": "example",
    "search": ["a.example"],
    "options": ["ndots:2"],
}


def _expected_add(version: str) -> dict[str, Any]:
    v11 = version == "1.1.0"
    legacy = version in ("0.3.0", "0.3.1", "0.4.0")
    return {
        "cniVersion": version,
        "interfaces": [INTERFACE_11 if v11 else INTERFACE_PRE_11],
        "ips": IPS_LEGACY if legacy else IPS_1X,
        "routes": ROUTES_11 if v11 else ROUTES_PRE_11,
        "dns": DNS_JSON,
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_add_renders_exact_shape_per_version(version: str) -> None:
    out, code = run(_env("ADD"), _conf(version), SPEC)
    assert code == 0
    assert json.loads(out) == _expected_add(version)
    # key order too: cniVersion first, as every reference plugin prints it
    assert next(iter(json.loads(out))) == "cniVersion"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("verb", ["DEL", "CHECK", "GC", "STATUS"])
def test_other_verbs_each_version(verb: str, version: str) -> None:
    allowed = {
        "DEL": True,
        "CHECK": version not in ("0.3.0", "0.3.1"),
        "GC": version == "1.1.0",
        "STATUS": version == "1.1.0",
    }[verb]
    out, code = run(_env(verb), _conf(version), SPEC)
    if allowed:
        assert (out, code) == ("", 0)
        assert [c.command for c in RecordingPlugin.calls] == [verb]
        assert RecordingPlugin.calls[0].cni_version == version
    else:
        err = json.loads(out)
        assert code == 1 and err["code"] == 1, "the spec's 'incompatible CNI version' code"
        assert verb in err["msg"] and version in err["msg"]
        assert err["cniVersion"] == version
        assert RecordingPlugin.calls == [], "no plugin code may run for a refused verb"


@pytest.mark.parametrize("version", VERSIONS)
def test_version_echoes_input_version(version: str) -> None:
    # podman asks VERSION with CNI_NETNS=dummy and no other CNI_* variables
    out, code = run({"CNI_COMMAND": "VERSION", "CNI_NETNS": "dummy"}, _conf(version), SPEC)
    assert code == 0
    assert json.loads(out) == {"cniVersion": version, "supportedVersions": list(VERSIONS)}
    assert RecordingPlugin.calls == []


@pytest.mark.parametrize("stdin", [b"", b"not json", b"[1]", b'{"cniVersion": 5}', b'{"cniVersion": "x.y"}'])
def test_version_never_fails_on_bad_stdin(stdin: bytes) -> None:
    env = {"CNI_COMMAND": "VERSION", "CNI_NETNS": "dummy", "CNI_IFNAME": "dummy", "CNI_PATH": "dummy"}
    out, code = run(env, stdin, SPEC)
    assert code == 0
    assert json.loads(out) == {"cniVersion": "1.1.0", "supportedVersions": list(VERSIONS)}


def test_no_command_prints_about_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    out, code = run({}, b"", SPEC)
    assert (out, code) == ("", 0)
    err = capsys.readouterr()
    assert err.out == ""
    assert "h1 test plugin" in err.err and "1.1.0" in err.err
    out, code = run({"CNI_COMMAND": ""}, _conf("1.0.0"), SPEC)
    assert (out, code) == ("", 0)


def test_request_carries_parsed_inputs() -> None:
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}], "ips": [{"address": "198.51.100.9/24"}]}
    stdin = _conf("1.0.0", prevResult=prev, runtimeConfig={"mac": "02:00:00:00:00:42"})
    env = _env("CHECK", CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAME=p;MAC=02:00:00:00:00:43;Other=x")
    out, code = run(env, stdin, SPEC)
    assert (out, code) == ("", 0)
    req = RecordingPlugin.calls[0]
    assert req.container_id == "c0ffee-1" and req.ifname == "eth0" and req.netns == "/var/run/netns/h1-test"
    assert req.path == ("/opt/cni/bin", "/usr/lib/cni")
    assert req.args["MAC"] == "02:00:00:00:00:43" and req.args["Other"] == "x"
    assert req.runtime_config == {"mac": "02:00:00:00:00:42"}
    assert req.prev_result is not None and req.prev_result.ips[0].address == "198.51.100.9/24"
    assert req.name == "rdma-net" and req.stdin == stdin


def test_plugin_known_args_need_no_ignore_unknown() -> None:
    out, code = run(
        _env("ADD", CNI_ARGS="MAC=02:00:00:00:00:43;K8S_POD_NAMESPACE=default"), _conf("1.0.0"), SPEC
    )
    assert code == 0, out


@pytest.mark.parametrize("key", ["cni.dev/valid-attachments", "cni.dev/attachments"])
def test_gc_reads_valid_attachments_both_keys(key: str) -> None:
    stdin = _conf(
        "1.1.0", **{key: [{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "net1"}]}
    )
    out, code = run(_env("GC", CNI_CONTAINERID=None, CNI_IFNAME=None, CNI_NETNS=None), stdin, SPEC)
    assert (out, code) == ("", 0)
    got = [(a.container_id, a.ifname) for a in RecordingPlugin.calls[0].valid_attachments or ()]
    assert got == [("a", "eth0"), ("b", "net1")]


def test_gc_without_list_has_none_and_status_needs_only_path() -> None:
    run(_env("GC", CNI_CONTAINERID=None, CNI_IFNAME=None, CNI_NETNS=None), _conf("1.1.0"), SPEC)
    assert RecordingPlugin.calls[0].valid_attachments is None
    env = {"CNI_COMMAND": "STATUS", "CNI_PATH": "/opt/cni/bin"}
    assert run(env, _conf("1.1.0"), SPEC) == ("", 0)


@pytest.mark.parametrize("netns", [None, "", "/proc/999999/ns/net", "relative/path"])
def test_del_accepts_any_or_no_netns(netns: str | None) -> None:
    out, code = run(_env("DEL", CNI_NETNS=netns), _conf("1.0.0"), SPEC)
    assert (out, code) == ("", 0)
    assert RecordingPlugin.calls[0].netns == (netns or "")


@pytest.mark.parametrize(
    "exc, code, text",
    [
        (CniError(CHECK_FAILED, "bond0 lost 198.51.100.10/24", "details here"), CHECK_FAILED, "bond0"),
        (CniError(STATUS_UNAVAILABLE, "no bond has an IP"), STATUS_UNAVAILABLE, "no bond"),
        (PermissionError(13, "Permission denied", "/var/lib/cni"), 5, "Permission denied"),
        (RuntimeError("boom"), INTERNAL_ERROR, "RuntimeError: boom"),
    ],
)
def test_plugin_errors_become_error_json(exc: BaseException, code: int, text: str) -> None:
    RecordingPlugin.fail = exc
    verb = "STATUS" if code == STATUS_UNAVAILABLE else "CHECK"
    out, rc = run(_env(verb), _conf("1.1.0"), SPEC)
    assert rc == 1
    err = json.loads(out)
    assert err["code"] == code and text in err["msg"] and err["cniVersion"] == "1.1.0"
    if isinstance(exc, CniError) and exc.details:
        assert err["details"] == exc.details
    assert set(err) <= {"cniVersion", "code", "msg", "details"}


def test_error_json_uses_config_version_or_current() -> None:
    out, _ = run(_env("ADD", CNI_IFNAME="x" * 16), _conf("0.4.0"), SPEC)
    assert json.loads(out)["cniVersion"] == "0.4.0"
    out, _ = run(_env("ADD"), _conf("9.9.9"), SPEC)
    assert json.loads(out)["cniVersion"] == "1.1.0"
    out, _ = run(_env("ADD"), b"{", SPEC)
    assert json.loads(out)["cniVersion"] == "1.1.0"


def _bad(stdin: bytes | None = None, **env: str | None) -> tuple[dict[str, str], bytes]:
    command = env.pop("CNI_COMMAND", None) or "ADD"
    return _env(command, **env), stdin if stdin is not None else _conf("1.0.0")


BAD_INPUTS: list[tuple[str, tuple[dict[str, str], bytes], int, str]] = [
    # malformed or oversized stdin -> 6
    ("json-truncated", _bad(b'{"cniVersion": "1.0.0"'), 6, "JSON"),
    ("json-array", _bad(b"[]"), 6, "JSON object"),
    ("json-string", _bad(b'"x"'), 6, "JSON object"),
    ("json-empty", _bad(b""), 6, "stdin"),
    ("json-whitespace", _bad(b"  \n"), 6, "stdin"),
    ("json-not-utf8", _bad(b'{"name": "\xff\xfe"}'), 6, "JSON"),
    ("stdin-huge", _bad(b'{"cniVersion":"1.0.0","name":"n","x":"' + b"a" * MAX_STDIN + b'"}'), 6, "limit"),
    # missing env -> 4
    ("env-no-containerid", _bad(CNI_CONTAINERID=None), 4, "CNI_CONTAINERID"),
    ("env-empty-containerid", _bad(CNI_CONTAINERID=""), 4, "CNI_CONTAINERID"),
    ("env-no-netns", _bad(CNI_NETNS=None), 4, "CNI_NETNS"),
    ("env-no-ifname", _bad(CNI_IFNAME=None), 4, "CNI_IFNAME"),
    ("env-no-path", _bad(CNI_PATH=None), 4, "CNI_PATH"),
    ("check-no-netns", _bad(CNI_COMMAND="CHECK", CNI_NETNS=None), 4, "CNI_NETNS"),
    ("del-no-containerid", _bad(CNI_COMMAND="DEL", CNI_CONTAINERID=None), 4, "CNI_CONTAINERID"),
    ("del-no-ifname", _bad(CNI_COMMAND="DEL", CNI_IFNAME=None), 4, "CNI_IFNAME"),
    ("gc-no-path", _bad(_conf("1.1.0"), CNI_COMMAND="GC", CNI_PATH=None), 4, "CNI_PATH"),
    ("netns-relative", _bad(CNI_NETNS="netns/pod"), 4, "CNI_NETNS"),
    # container IDs -> 4
    ("cid-dotdot-slash", _bad(CNI_CONTAINERID="../x"), 4, "CNI_CONTAINERID"),
    ("cid-slash", _bad(CNI_CONTAINERID="a/b"), 4, "CNI_CONTAINERID"),
    ("cid-leading-dash", _bad(CNI_CONTAINERID="-abc"), 4, "CNI_CONTAINERID"),
    ("cid-leading-dot", _bad(CNI_CONTAINERID=".abc"), 4, "CNI_CONTAINERID"),
    ("cid-space", _bad(CNI_CONTAINERID="a b"), 4, "CNI_CONTAINERID"),
    ("cid-newline", _bad(CNI_CONTAINERID="abc\n"), 4, "CNI_CONTAINERID"),
    ("del-cid-dotdot", _bad(CNI_COMMAND="DEL", CNI_CONTAINERID="../../etc"), 4, "CNI_CONTAINERID"),
    # interface names -> 4
    ("ifname-16-chars", _bad(CNI_IFNAME="a" * 16), 4, "CNI_IFNAME"),
    ("ifname-16-bytes-utf8", _bad(CNI_IFNAME="\u00e9" * 8), 4, "CNI_IFNAME"),
    ("ifname-slash", _bad(CNI_IFNAME="eth/0"), 4, "CNI_IFNAME"),
    ("ifname-dot", _bad(CNI_IFNAME="."), 4, "CNI_IFNAME"),
    ("ifname-dotdot", _bad(CNI_IFNAME=".."), 4, "CNI_IFNAME"),
    ("ifname-space", _bad(CNI_IFNAME="eth 0"), 4, "CNI_IFNAME"),
    ("ifname-tab", _bad(CNI_IFNAME="eth\t0"), 4, "CNI_IFNAME"),
    ("ifname-colon", _bad(CNI_IFNAME="eth0:1"), 4, "CNI_IFNAME"),
    ("del-ifname-slash", _bad(CNI_COMMAND="DEL", CNI_IFNAME="../eth0"), 4, "CNI_IFNAME"),
    # versions -> 1 (unknown or too old for the verb), wrong type -> 7
    ("version-unknown", _bad(_conf("9.9.9")), 1, "cniVersion"),
    ("version-too-old", _bad(_conf("0.2.0")), 1, "cniVersion"),
    ("version-not-semver", _bad(_conf("1.0")), 1, "cniVersion"),
    ("version-int", _bad(json.dumps({"cniVersion": 1, "name": "n"}).encode()), 7, "cniVersion"),
    ("version-missing", _bad(json.dumps({"name": "n"}).encode()), 7, "cniVersion"),
    ("check-0.3.1", _bad(_conf("0.3.1"), CNI_COMMAND="CHECK"), 1, "CHECK"),
    ("check-0.3.0", _bad(_conf("0.3.0"), CNI_COMMAND="CHECK"), 1, "CHECK"),
    ("gc-1.0.0", _bad(_conf("1.0.0"), CNI_COMMAND="GC"), 1, "GC"),
    ("status-0.4.0", _bad(_conf("0.4.0"), CNI_COMMAND="STATUS"), 1, "STATUS"),
    # CNI_ARGS -> 4
    ("args-unknown-key", _bad(CNI_ARGS="K8S_POD_NAME=p;FOO=bar"), 4, "CNI_ARGS"),
    ("args-unknown-ignore-false", _bad(CNI_ARGS="IgnoreUnknown=false;FOO=bar"), 4, "FOO"),
    ("args-unknown-ignore-0", _bad(CNI_ARGS="IgnoreUnknown=0;FOO=bar"), 4, "FOO"),
    ("args-no-equals", _bad(CNI_ARGS="IgnoreUnknown=1;FOO"), 4, "CNI_ARGS"),
    ("args-empty-key", _bad(CNI_ARGS="IgnoreUnknown=1;=bar"), 4, "CNI_ARGS"),
    ("args-double-equals", _bad(CNI_ARGS="IgnoreUnknown=1;A=b=c"), 4, "CNI_ARGS"),
    ("args-ignore-not-bool", _bad(CNI_ARGS="IgnoreUnknown=maybe"), 4, "IgnoreUnknown"),
    # config fields of the wrong type or value -> 7
    ("name-missing", _bad(json.dumps({"cniVersion": "1.0.0"}).encode()), 7, "name"),
    ("name-int", _bad(json.dumps({"cniVersion": "1.0.0", "name": 3}).encode()), 7, "name"),
    ("name-path", _bad(json.dumps({"cniVersion": "1.0.0", "name": "../x"}).encode()), 7, "name"),
    ("type-int", _bad(_conf("1.0.0", type=5)), 7, "type"),
    ("runtimeconfig-list", _bad(_conf("1.0.0", runtimeConfig=[])), 7, "runtimeConfig"),
    ("runtimeconfig-string", _bad(_conf("1.0.0", runtimeConfig="mac")), 7, "runtimeConfig"),
    ("runtimeconfig-false", _bad(_conf("1.0.0", runtimeConfig=False)), 7, "runtimeConfig"),
    ("prevresult-list", _bad(_conf("1.0.0", prevResult=[])), 7, "prevResult"),
    ("prevresult-ips-object", _bad(_conf("1.0.0", prevResult={"ips": {}})), 7, "ips"),
    (
        "prevresult-address-no-prefix",
        _bad(_conf("1.0.0", prevResult={"ips": [{"address": "198.51.100.1"}]})),
        7,
        "ips[].address",
    ),
    (
        "prevresult-address-garbage",
        _bad(_conf("1.0.0", prevResult={"ips": [{"address": "300.1.1.1/24"}]})),
        7,
        "ips[].address",
    ),
    (
        "prevresult-interface-str",
        _bad(_conf("1.0.0", prevResult={"ips": [{"address": "198.51.100.1/24", "interface": "0"}]})),
        7,
        "interface",
    ),
    (
        "prevresult-route-dst",
        _bad(_conf("1.0.0", prevResult={"routes": [{"dst": "nowhere"}]})),
        7,
        "routes[].dst",
    ),
    (
        "prevresult-route-gw",
        _bad(_conf("1.0.0", prevResult={"routes": [{"dst": "0.0.0.0/0", "gw": "x"}]})),
        7,
        "routes[].gw",
    ),
    (
        "prevresult-dns-string",
        _bad(_conf("1.0.0", prevResult={"dns": {"nameservers": "198.51.100.53"}})),
        7,
        "nameservers",
    ),
    (
        "gc-attachments-not-list",
        _bad(_conf("1.1.0", **{"cni.dev/valid-attachments": {}}), CNI_COMMAND="GC"),
        7,
        "cni.dev/valid-attachments",
    ),
    (
        "gc-attachments-no-ifname",
        _bad(_conf("1.1.0", **{"cni.dev/valid-attachments": [{"containerID": "a"}]}), CNI_COMMAND="GC"),
        7,
        "ifname",
    ),
    (
        "gc-attachments-old-key-bad",
        _bad(_conf("1.1.0", **{"cni.dev/attachments": "a"}), CNI_COMMAND="GC"),
        7,
        "cni.dev/attachments",
    ),
    # unknown commands -> 4
    ("command-unknown", _bad(CNI_COMMAND="FOO"), 4, "CNI_COMMAND"),
    ("command-lowercase", _bad(CNI_COMMAND="add"), 4, "CNI_COMMAND"),
    ("command-get", _bad(CNI_COMMAND="GET"), 4, "CNI_COMMAND"),
]


def test_bad_input_table_is_large_enough() -> None:
    assert len(BAD_INPUTS) >= 40
    assert len({name for name, *_ in BAD_INPUTS}) == len(BAD_INPUTS)


@pytest.mark.parametrize("name, request_, code, field", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input(name: str, request_: tuple[dict[str, str], bytes], code: int, field: str) -> None:
    env, stdin = request_
    out, rc = run(env, stdin, SPEC)
    assert rc == 1
    err = json.loads(out)
    assert err["code"] == code, err
    assert field in err["msg"], err
    assert RecordingPlugin.calls == [], "bad input must be refused before any plugin code runs"


# ------------------------------------------------------------------ CNI_NETNS = the plugin's own netns
OWN_NETNS_PATHS = ("/proc/self/ns/net", "/proc/thread-self/ns/net")


@pytest.mark.parametrize("verb", ["ADD", "DEL", "CHECK"])
@pytest.mark.parametrize("path", OWN_NETNS_PATHS)
def test_own_netns_is_refused_with_8_before_the_plugin_runs(verb: str, path: str) -> None:
    out, rc = run(_env(verb, CNI_NETNS=path), _conf("1.0.0"), SPEC)
    assert rc == 1 and RecordingPlugin.calls == []
    err = json.loads(out)
    assert err["code"] == 8
    assert err["msg"] == "plugin's netns and netns from CNI_NETNS should not be the same"
    assert "CNI_NETNS_OVERRIDE=1" in err["details"] and path in err["details"]


@pytest.mark.parametrize("override", ["1", "true", "TRUE"])
def test_cni_netns_override_lets_the_own_netns_through(override: str) -> None:
    env = _env("ADD", CNI_NETNS="/proc/self/ns/net", CNI_NETNS_OVERRIDE=override)
    out, rc = run(env, _conf("1.0.0"), SPEC)
    assert rc == 0, out
    assert [c.netns for c in RecordingPlugin.calls] == ["/proc/self/ns/net"]


@pytest.mark.parametrize("override", ["", "0", "false", "yes"])
def test_anything_else_in_cni_netns_override_keeps_the_guard(override: str) -> None:
    env = _env("DEL", CNI_NETNS="/proc/self/ns/net", CNI_NETNS_OVERRIDE=override)
    out, rc = run(env, _conf("1.0.0"), SPEC)
    assert rc == 1 and json.loads(out)["code"] == 8


@pytest.mark.parametrize("path", ["/proc/self/ns/uts", "/var/run/netns/h1-no-such", "/etc/hostname"])
def test_other_paths_pass_the_guard(path: str) -> None:
    """Another namespace file (same nsfs device, other inode), a missing path, a plain file: not
    the plugin's netns; the verbs judge them (ADD: 4, DEL: tolerated)."""
    out, rc = run(_env("ADD", CNI_NETNS=path), _conf("1.0.0"), SPEC)
    assert rc == 0, out
