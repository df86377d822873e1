"""The agent's wire protocol across versions (docs/compatibility-policy.md, "The agent's wire
protocol"): the previous version's thin clients (Python and C) are served by this agent, this
version's clients are served by the previous agent, and peers with no version in common refuse
by naming both versions, the client running the call in-process.

The previous version is the ``rdma_cni`` of :data:`previous_version.PREVIOUS` (wire version 1,
no offer), unpacked from git history and run as real processes; the probe plugin of
``test_agent_probe`` reports the environment each call ran with. A client or agent *newer* than
this code does not exist yet: those sides are the bytes the protocol defines for them, sent and
read on a real socket.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import previous_version
import pytest
from netns import build_c_client, launch_agent
from netns import stop_agent as stop
from probe_agent import RunningAgent, cni_env, in_process, probe_conf, read_json

from rdma_cni.agent import client, wire

pytestmark = pytest.mark.netns

PROBE_DIR = os.path.dirname(os.path.abspath(__file__))  # test_agent_probe, the plugin served


def start(tmp: Path, code: str = "") -> RunningAgent:
    """An rdma-agent of this checkout (or of the code unpacked at ``code``) serving the probe plugin
    on a socket of the test's own."""
    sock, log = str(tmp / "agent.sock"), tmp / "agent.log"
    env = dict(os.environ, **(previous_version.env(code) if code else {}))
    env["PYTHONPATH"] = ":".join(p for p in (code or previous_version.REPO, PROBE_DIR) if p)
    proc = launch_agent(sock, str(log), "--reconcile-interval", "-1", "--prefork", "1",
                        "--plugin", "probe=test_agent_probe:SPEC", env=env)
    return RunningAgent(proc, sock, log)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    """This version's agent."""
    running = start(tmp_path)
    try:
        yield running
    finally:
        stop(running.proc)


@pytest.fixture(scope="module")
def previous_code(tmp_path_factory: pytest.TempPathFactory) -> str:
    return previous_version.unpack(str(tmp_path_factory.mktemp("previous")))


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory, previous_code: str) -> dict[str, Path]:
    """The C client of this checkout and of the previous version, each named ``probe``."""
    out: dict[str, Path] = {}
    this = tmp_path_factory.mktemp("c-this")
    build_c_client(str(this))
    out["this"] = this
    prev = tmp_path_factory.mktemp("c-previous")
    subprocess.run(["cc", "-O2", "-o", str(prev / "rdma-cni-client"),
                    os.path.join(previous_code, "rdma_cni", "agent", "client.c")], check=True, timeout=300)
    out["previous"] = prev
    for d in out.values():
        (d / "probe").symlink_to("rdma-cni-client")
        fallback = d / "fallback.sh"
        fallback.write_text('#!/bin/sh\nprintf "fallback ran"\nexit 42\n')
        fallback.chmod(0o755)
    return out


@pytest.fixture
def previous_agent(tmp_path: Path, previous_code: str) -> Iterator[RunningAgent]:
    """The previous version's rdma-agent (its code, the same probe plugin)."""
    running = start(tmp_path, previous_code)
    try:
        yield running
    finally:
        stop(running.proc)


def run_c(exe_dir: Path, env: dict[str, str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    env = dict(env, RDMA_CNI_FALLBACK=str(exe_dir / "fallback.sh"))
    return subprocess.run([str(exe_dir / "probe")], input=stdin, env=env, capture_output=True, timeout=60)


def previous_python_forward(code: str, sock: str, env: dict[str, str], stdin: bytes) -> tuple[int, str]:
    """The previous version's Python client, in a process of its own: (exit code, stdout)."""
    script = ("import json, sys; from rdma_cni.agent import client, wire\n"
              "assert not hasattr(wire, 'OFFER_ENV')  # the client from before the offer\n"
              "env, stdin = json.loads(sys.argv[1]), sys.stdin.buffer.read()\n"
              f"a = client.forward('probe', env, stdin, path={sock!r})\n"
              "sys.stdout.write(a.stdout if a else 'not served'); sys.exit(a.code if a else 99)\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(env)], input=stdin, capture_output=True,
                          timeout=60, env=dict(env, **previous_version.env(code)), cwd="/")
    assert proc.returncode != 1 or proc.stdout, proc.stderr.decode()
    return proc.returncode, proc.stdout.decode()


# ------------------------------------------------------------------ the pure rules
@pytest.mark.parametrize("offered, spoken, agreed", [
    ((1, 1), (1, 2), 1), ((1, 2), (1, 2), 2), ((2, 3), (1, 2), 2), ((3, 4), (1, 2), None),
    ((1, 1), (2, 3), None),
])
def test_the_highest_common_version_is_served(
    offered: wire.Range, spoken: wire.Range, agreed: int | None
) -> None:
    assert wire.agree(offered, spoken) == agreed


@pytest.mark.parametrize("text", ["", "2", "a-b", "2-1", "0-1", "-1-2"])
def test_an_offer_that_is_not_a_range_is_a_wire_error(text: str) -> None:
    with pytest.raises(wire.WireError, match="RDMA_CNI_WIRE"):
        wire.parse_offer(text)


# ------------------------------------------------------------------ this version with itself
def test_this_client_offers_its_versions_and_the_plugin_never_sees_the_offer(
    agent: RunningAgent, clients: dict[str, Path], tmp_path: Path
) -> None:
    for name, call in [("python", None), ("c", clients["this"])]:
        marker = tmp_path / f"{name}.json"
        env = dict(cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=agent.sock)
        stdin = probe_conf(probeFile=str(marker))
        if call is None:
            answer = client.forward("probe", env, stdin, path=agent.sock)
            assert answer is not None
            got = (answer.stdout, answer.code)
            seen = dict(env)
        else:
            proc = run_c(call, env, stdin)
            got = (proc.stdout.decode(), proc.returncode)
            seen = dict(env, RDMA_CNI_FALLBACK=str(call / "fallback.sh"))
        assert read_json(marker)["environ"] == seen, name  # read before in_process rewrites it
        assert got == in_process(env, stdin), name


# ------------------------------------------------------------------ old client, new agent
@pytest.mark.parametrize("command", ["ADD", "DEL", "VERSION"])
def test_the_previous_thin_clients_are_served_by_this_agent(
    agent: RunningAgent, clients: dict[str, Path], previous_code: str, tmp_path: Path, command: str
) -> None:
    env = dict(cni_env(command), RDMA_CNI_AGENT_SOCKET=agent.sock)
    py_in, c_in = (probe_conf(probeFile=str(tmp_path / f"{who}.json")) for who in ("py", "c"))
    py = previous_python_forward(previous_code, agent.sock, env, py_in)
    c = run_c(clients["previous"], env, c_in)
    if command != "VERSION":  # the probe reports where ADD and DEL ran: in this agent's worker
        assert read_json(tmp_path / "py.json")["environ"] == env
        assert read_json(tmp_path / "c.json")["environ"] == dict(
            env, RDMA_CNI_FALLBACK=str(clients["previous"] / "fallback.sh"))
    assert py == in_process(env, py_in)[::-1]
    assert (c.stdout.decode(), c.returncode) == in_process(env, c_in), c.stderr


# ------------------------------------------------------------------ new client, old agent
def test_this_versions_clients_are_served_by_the_previous_agent(
    previous_agent: RunningAgent, clients: dict[str, Path], tmp_path: Path
) -> None:
    """The previous agent does not know the offer: it hands it to the plugin as a variable, which
    no plugin reads, and serves the call as version 1 (the same conversation)."""
    env = dict(cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=previous_agent.sock)
    py_in, c_in = (probe_conf(probeFile=str(tmp_path / f"{who}.json")) for who in ("py", "c"))
    answer = client.forward("probe", env, py_in, path=previous_agent.sock)
    c = run_c(clients["this"], env, c_in)
    assert read_json(tmp_path / "py.json")["environ"] == {**env, wire.OFFER_ENV: "1-2"}
    assert read_json(tmp_path / "c.json")["environ"] == dict(
        env, RDMA_CNI_FALLBACK=str(clients["this"] / "fallback.sh"), **{wire.OFFER_ENV: "1-2"})
    assert answer is not None and (answer.stdout, answer.code) == in_process(env, py_in)
    assert (c.stdout.decode(), c.returncode) == in_process(env, c_in), c.stderr


# ------------------------------------------------------------------ a newer client, this agent
def raw_call(sock: str, env: dict[str, str], stdin: bytes) -> tuple[bytes, list[bytes]]:
    """A client's request, as the protocol frames it, with ``env`` sent as given (offer included):
    the first reply byte and, after READY or SKEW, the frame that follows."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    fds = [os.open(p, os.O_RDONLY | f) for p, f in (("/proc/self/ns/net", 0), ("/proc/self/ns/mnt", 0),
                                                    ("/", os.O_DIRECTORY))]
    try:
        s.connect(sock)
        frame = wire.encode_items([b"probe", stdin, *(f"{k}={v}".encode() for k, v in env.items())])
        socket.send_fds(s, [frame], fds)
        reply = s.recv(1)
        if reply == wire.READY:
            s.sendall(wire.GO)
        return reply, wire.recv_frame(s) if reply in (wire.READY, wire.SKEW) else []
    finally:
        for fd in fds:
            os.close(fd)
        s.close()


def test_a_newer_client_that_still_speaks_this_version_is_served(agent: RunningAgent, tmp_path: Path) -> None:
    env = cni_env("ADD")
    stdin = probe_conf(probeFile=str(tmp_path / "m"))
    reply, answer = raw_call(agent.sock, {**env, wire.OFFER_ENV: "2-3"}, stdin)
    assert reply == wire.READY
    assert read_json(tmp_path / "m")["environ"] == env  # the offer is the agent's, not the plugin's
    assert wire.decode_answer(answer)[:2] == in_process(env, stdin)[::-1]


def test_a_client_with_no_version_in_common_is_refused_naming_both(
    agent: RunningAgent, tmp_path: Path
) -> None:
    marker = tmp_path / "never.json"
    reply, frame = raw_call(agent.sock, {**cni_env("ADD"), wire.OFFER_ENV: "3-4"},
                            probe_conf(probeFile=str(marker)))
    assert reply == wire.SKEW
    reason = b"".join(frame).decode()
    assert "the thin client speaks wire versions 3-4 and rdma-agent 1-2" in reason
    assert "no version in common (the thin client is the newer one)" in reason
    assert "refused a call: the thin client speaks wire versions 3-4" in agent.log.read_text()
    reply, frame = raw_call(agent.sock, {**cni_env("ADD"), wire.OFFER_ENV: "two"}, probe_conf())
    assert (reply, frame) == (wire.REFUSE, [])  # not an offer of ours: a plain refusal
    assert not marker.exists()  # never run


# ------------------------------------------------------------------ this client, a newer agent
@pytest.fixture
def newer_agent(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """An agent that speaks only wire versions 3-4: the bytes it answers a 1-2 offer with (SKEW and
    the reason), on a real socket. Yields the socket and the offers it received."""
    path = str(tmp_path / "newer.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    srv.settimeout(60)
    offers: list[str] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                head, fds, _, _ = socket.recv_fds(conn, 12, 4)
                for fd in fds:
                    os.close(fd)
                _, env, _ = wire.decode_request(wire.recv_frame(conn, head))
                offered = wire.parse_offer(env.get(wire.OFFER_ENV))
                offers.append(wire.offer(offered))
                reason = wire.skew_reason(offered, (3, 4)).encode()
                conn.sendall(wire.SKEW + wire.encode_items([reason]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path, offers
    finally:
        done.set()
        srv.close()
        thread.join(timeout=10)


def test_this_client_falls_back_naming_both_versions_when_the_agent_is_newer(
    newer_agent: tuple[str, list[str]], clients: dict[str, Path], tmp_path: Path
) -> None:
    sock, offers = newer_agent
    env = dict(cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=sock)
    script = ("import os, sys; from rdma_cni.agent import client\n"
              "code = client.try_agent('probe')\n"
              "sys.stdout.write('in-process' if code is None else f'agent {code}')\n")
    proc = subprocess.run([sys.executable, "-c", script], input=probe_conf(), capture_output=True,
                          timeout=60, env=dict(env, PYTHONPATH=previous_version.REPO))
    assert proc.stdout == b"in-process", proc.stderr
    expected = "the thin client speaks wire versions 1-2 and rdma-agent 3-4: no version in common " \
               "(rdma-agent is the newer one)"
    assert expected in proc.stderr.decode()
    assert "running the call in-process" in proc.stderr.decode()
    c = run_c(clients["this"], env, probe_conf())
    assert (c.returncode, c.stdout) == (42, b"fallback ran")  # the in-process implementation ran
    assert expected in c.stderr.decode() and "running the call in-process" in c.stderr.decode()
    assert offers == ["1-2", "1-2"]
