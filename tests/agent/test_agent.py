"""rdma-agent and its Python client, served the probe plugin of ``test_agent_probe``
(``tests/probe_agent.py``): the socket, where and how a call runs, crashes, ``try_agent``.

Real agent processes, real unix sockets, real namespaces, real kill -9. The probe reports where it
ran, which proves the worker takes the caller's namespaces and environment; the worker pool is in
``test_agent_pool.py``, the C client in ``test_agent_c_client.py``, and the plugin-level tests
(identical results with the real rdma-macvlan, DEL after a crash, reconcile) in
``test_agent_macvlan.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import probe_agent
import pytest
import yaml
from netns import build_c_client, children_of
from netns import stop_agent as stop
from probe_agent import (
    RunningAgent,
    cni_env,
    forward_in_thread,
    in_process,
    is_zombie,
    new_netns,
    probe_conf,
    read_json,
    start_agent,
)

from rdma_cni.agent import client, wire

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]

# The agent on a socket of the test's own, and network namespaces made on demand and deleted
# afterwards (tests/probe_agent.py).
agent = probe_agent.agent
netns = probe_agent.netns


# --- the socket --------------------------------------------------------------------------------


def test_socket_is_0600_and_owned_by_root(agent: RunningAgent) -> None:
    st = os.stat(agent.sock)
    assert oct(st.st_mode & 0o777) == oct(0o600)
    assert (st.st_uid, st.st_gid) == (0, 0)


def test_sigterm_removes_the_socket(tmp_path: Path) -> None:
    running = start_agent(tmp_path)
    stop(running.proc)
    assert running.proc.returncode == 0
    assert not os.path.exists(running.sock)


# A second agent on the same socket waits for the first one and its calls to end, then takes over
# (a rolling update's surge pod): test_agent_handover.py.


@pytest.fixture(scope="module")
def probe_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The two readiness probes, with the same options: ``rdma-agent --probe`` and the C client's
    (what the DaemonSet runs: ~1 ms of CPU against the bundle's ~140 ms)."""
    out = tmp_path_factory.mktemp("c-client")
    build_c_client(str(out))
    return {
        "python": [sys.executable, "-m", "rdma_cni.cli.agent", "--probe"],
        "c": [str(out / "rdma-cni-client"), "--probe"],
    }


@pytest.fixture(params=["python", "c"])
def probe_argv(request: pytest.FixtureRequest, probe_programs: dict[str, list[str]]) -> list[str]:
    return probe_programs[request.param]


def _probe(argv: list[str], sock: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*argv, "--socket", sock, *extra], cwd=REPO, stderr=subprocess.PIPE, text=True)


def test_the_readiness_probe_started_before_the_agent_waits_for_it_to_answer(
    tmp_path: Path, probe_argv: list[str]
) -> None:
    """As kubelet runs it: the probe comes as the container starts, before the agent listens."""
    early = _probe(probe_argv, str(tmp_path / "agent.sock"), "--probe-wait", "60")
    time.sleep(2)
    assert early.poll() is None, "the probe gave up before the agent listened"
    running = start_agent(tmp_path)
    try:
        _, err = early.communicate(timeout=90)
        assert early.returncode == 0, err
        assert f"agent on {running.sock} serves rdma-macvlan" in err
    finally:
        stop(running.proc)
    # nobody there, and a short wait: the same answer as without one, after it
    gone = _probe(probe_argv, running.sock, "--probe-wait", "0.5")
    _, err = gone.communicate(timeout=60)
    assert gone.returncode == 1 and "no agent answered" in err, err
    # an option it cannot read is refused as a usage error, not taken for "not ready"
    bad = _probe(probe_argv, running.sock, "--probe-wait", "soon")
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "--probe-wait" in err, err


def test_the_daemonsets_probe_command_runs_as_written_on_the_c_client(
    tmp_path: Path, probe_programs: dict[str, list[str]]
) -> None:
    """The manifest's argv, only the program (the built client) and the socket (a test agent's)
    replaced: an option the C client does not take would fail here (exit 2), not on a node."""
    ds = next(d for d in yaml.safe_load_all((REPO / "conf/k8s/rdma-cni.yaml").read_text()) if d
              and d["kind"] == "DaemonSet")
    container = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "rdma-agent")
    argv = list(container["readinessProbe"]["exec"]["command"])
    assert os.path.basename(argv[0]) == "rdma-cni-client"
    running = start_agent(tmp_path)
    try:
        argv[0] = probe_programs["c"][0]
        argv[argv.index("--socket") + 1] = running.sock
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert f"agent on {running.sock} serves rdma-macvlan" in proc.stderr
    finally:
        stop(running.proc)


def test_peer_that_is_not_root_is_refused_even_through_an_open_socket(
    agent: RunningAgent, tmp_path: Path
) -> None:
    os.chmod(agent.sock, 0o666)  # only the peer-credential check is left to stop it
    os.chmod(tmp_path, 0o755)
    marker = tmp_path / "ran.json"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.setgid(65534)
            os.setuid(65534)
            answer = client.forward(
                "probe", cni_env("ADD"), probe_conf(probeFile=str(marker)), path=agent.sock
            )
            os._exit(10 if answer is None else 11)
        except BaseException:  # noqa: BLE001 - a forked child must never return into pytest
            os._exit(12)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 10
    assert not marker.exists()


def test_client_that_gives_up_before_go_never_has_the_call_run(agent: RunningAgent, tmp_path: Path) -> None:
    marker = tmp_path / "ran.json"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(agent.sock)
        client._send_request(sock, "probe", cni_env("ADD"), probe_conf(probeFile=str(marker)))
        assert sock.recv(1) == wire.READY
    time.sleep(0.5)
    assert not marker.exists()


# --- where and how the call runs ---------------------------------------------------------------


def test_worker_runs_in_the_callers_namespaces_with_its_environment(tmp_path: Path, netns: list[str]) -> None:
    agent_ns = new_netns(netns)
    running = start_agent(tmp_path, netns=agent_ns)
    try:
        marker = tmp_path / "where.json"
        answer = client.forward("probe", cni_env("ADD"), probe_conf(probeFile=str(marker)), path=running.sock)
        assert answer is not None and answer.code == 0
        where = read_json(marker)
        assert where["net"] == os.stat("/proc/self/ns/net").st_ino  # the test's, not the agent's
        assert where["mnt"] == os.stat("/proc/self/ns/mnt").st_ino
        assert where["env"] == "from-the-caller"
        assert where["pid"] not in (os.getpid(), running.pid)
        assert where["cwd"] == "/"

        # A caller inside another netns (ip netns exec: its own mount namespace too).
        caller_ns = new_netns(netns)
        marker2 = tmp_path / "where2.json"
        script = (
            "import json,os,sys; from rdma_cni.agent import client; "
            f"a = client.forward('probe', {cni_env('ADD')!r}, {probe_conf(probeFile=str(marker2))!r}, "
            f"path={running.sock!r}); "
            "print(json.dumps([a is not None and a.code, os.stat('/proc/self/ns/net').st_ino, "
            "os.stat('/proc/self/ns/mnt').st_ino]))"
        )
        out = subprocess.run(
            ["ip", "netns", "exec", caller_ns, sys.executable, "-c", script],
            check=True,
            capture_output=True,
            cwd=REPO,
        )
        code, net, mnt = json.loads(out.stdout)
        where2 = read_json(marker2)
        assert code == 0
        assert (where2["net"], where2["mnt"]) == (net, mnt)
        assert net != where["net"]
    finally:
        stop(running.proc)


def test_worker_environment_is_exactly_the_callers(tmp_path: Path) -> None:
    """Variables only the agent has are gone, the ones the caller changed take its value, and the
    next worker starts from the agent's environment again."""
    running = start_agent(tmp_path, agent_env={"H8_AGENT_ONLY": "agent", "H7_PROBE": "from-the-agent"})
    try:
        for n, env in enumerate([cni_env("ADD"), cni_env("DEL", H8_CALLER_ONLY="caller", PATH="/nowhere")]):
            marker = tmp_path / f"env{n}.json"
            answer = client.forward("probe", env, probe_conf(probeFile=str(marker)), path=running.sock)
            assert answer is not None and answer.code == 0
            assert read_json(marker)["environ"] == env
    finally:
        stop(running.proc)


@pytest.mark.parametrize(
    "command,conf,env_extra",
    [
        ("ADD", {}, {}),
        ("CHECK", {}, {}),
        ("DEL", {}, {}),
        ("GC", {}, {}),
        ("STATUS", {}, {}),
        ("VERSION", {}, {}),
        ("ADD", {"fail": True}, {}),  # the plugin's own error
        ("ADD", {}, {"CNI_IFNAME": "much-too-long-ifname"}),  # a protocol error
        ("FROB", {}, {}),  # unknown verb
        ("ADD", {"cniVersion": "0.2.0"}, {}),  # incompatible version
    ],
)
def test_agent_answer_equals_the_in_process_answer(
    agent: RunningAgent, command: str, conf: dict[str, object], env_extra: dict[str, str]
) -> None:
    plain = not conf and not env_extra
    conf = dict(conf)
    version = str(conf.pop("cniVersion", "1.1.0"))
    env = cni_env(command, **env_extra)
    stdin = probe_conf(version, **conf)
    answer = client.forward("probe", env, stdin, path=agent.sock)
    assert answer is not None
    assert (answer.stdout, answer.code) == in_process(env, stdin)
    if command in ("ADD", "CHECK", "DEL") and plain:
        assert f"probe {command} on stderr" in answer.stderr


def test_unknown_plugin_is_refused(agent: RunningAgent) -> None:
    assert client.forward("no-such-plugin", cni_env("ADD"), probe_conf(), path=agent.sock) is None


def test_busy_agent_refuses_so_the_caller_runs_in_process(tmp_path: Path) -> None:
    running = start_agent(tmp_path, "--max-workers", "1")
    # the first call holds the only worker until the second was refused, however slow the machine
    release = tmp_path / "release"
    try:
        started = tmp_path / "started.json"
        slow = threading.Thread(
            target=client.forward,
            args=("probe", cni_env("ADD"), probe_conf(holdFile=str(release), startedFile=str(started))),
            kwargs={"path": running.sock},
        )
        slow.start()
        read_json(started)
        assert client.forward("probe", cni_env("DEL"), probe_conf(), path=running.sock) is None
        release.touch()
        slow.join()
    finally:
        release.touch()
        stop(running.proc)


ENTER_CALLER = """
import json, os, subprocess, time
from rdma_cni.agent import namespaces
namespaces.warm()
other = subprocess.Popen(["unshare", "--mount", "sleep", "60"])
try:
    own = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    while os.stat(f"/proc/{other.pid}/ns/mnt").st_ino == os.fstat(own).st_ino:
        time.sleep(0.01)  # unshare has not run yet
    theirs = os.open(f"/proc/{other.pid}/ns/mnt", os.O_RDONLY)
    net = os.open("/proc/self/ns/net", os.O_RDONLY)
    same = namespaces.enter_caller(net, own)
    cwd_same = os.getcwd()
    moved = namespaces.enter_caller(net, theirs)
    joined = os.stat("/proc/self/ns/mnt").st_ino == os.fstat(theirs).st_ino
    print(json.dumps([same, cwd_same, moved, joined]))
finally:
    other.kill()
    other.wait()
"""


def test_a_caller_in_the_agents_own_mount_namespace_is_not_joined_again(tmp_path: Path) -> None:
    """The same mount namespace (by inode) is skipped, with the cwd still reset to /; another one
    is joined."""
    out = subprocess.run([sys.executable, "-c", ENTER_CALLER], capture_output=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert json.loads(out.stdout) == [False, "/", True, True]


def test_caller_whose_mounts_hide_the_agents_code_is_refused(agent: RunningAgent, tmp_path: Path) -> None:
    """A worker joins the caller's mount namespace and may import lazily from there: when the
    agent's package is another file at that path (an agent image that is not the node's install),
    the call is refused and runs in-process instead."""
    import rdma_cni

    empty = tmp_path / "empty"
    empty.mkdir()
    marker = tmp_path / "ran.json"
    package_dir = os.path.dirname(os.path.abspath(rdma_cni.__file__))
    script = f"""
import ctypes, json, subprocess, sys
from rdma_cni.agent import client
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x00020000) == 0, "unshare(CLONE_NEWNS)"
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
subprocess.run(["mount", "--bind", {str(empty)!r}, {package_dir!r}], check=True)
a = client.forward("probe", {cni_env("ADD")!r}, {probe_conf(probeFile=str(marker))!r}, path={agent.sock!r})
print(json.dumps(a is None))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert json.loads(out.stdout) is True
    assert not marker.exists()
    assert "another file in the caller's mount namespace" in agent.log.read_text()


# --- crashes -----------------------------------------------------------------------------------


def test_agent_killed_mid_request_the_call_still_completes(agent: RunningAgent, tmp_path: Path) -> None:
    started, done = tmp_path / "started.json", tmp_path / "done.json"
    stdin = probe_conf(sleep=1.0, startedFile=str(started), probeFile=str(done))
    thread, box = forward_in_thread(agent.sock, cni_env("ADD"), stdin)
    read_json(started)
    children = children_of(agent.pid)
    assert len(children) >= 2  # the busy worker and at least one idle one
    os.kill(agent.pid, signal.SIGKILL)
    agent.proc.wait()
    thread.join(30)
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") and not is_zombie(pid) for pid in children):
        assert time.monotonic() < deadline, "idle workers outlived the agent"
        time.sleep(0.05)
    answer = box[0]
    assert isinstance(answer, client.Answer)
    assert (answer.stdout, answer.code) == in_process(cni_env("ADD"), probe_conf())
    assert done.exists()
    # The stale socket is left behind; a new call finds nobody listening and runs in-process.
    assert os.path.exists(agent.sock)
    assert client.forward("probe", cni_env("DEL"), probe_conf(), path=agent.sock) is None


def test_worker_killed_mid_add_answers_try_again_later(agent: RunningAgent, tmp_path: Path) -> None:
    started, done = tmp_path / "started.json", tmp_path / "done.json"
    stdin = probe_conf("1.0.0", sleep=5, startedFile=str(started), probeFile=str(done))
    thread, box = forward_in_thread(agent.sock, cni_env("ADD"), stdin)
    worker = int(str(read_json(started)["pid"]))
    os.kill(worker, signal.SIGKILL)
    thread.join(30)
    answer = box[0]
    assert isinstance(answer, client.Answer)
    assert answer.code == 1
    err = json.loads(answer.stdout)
    assert err["code"] == 11 and err["cniVersion"] == "1.0.0"
    assert "DEL" in err["msg"]
    assert not done.exists()


def test_agent_and_workers_killed_mid_add_the_add_runs_in_process(
    agent: RunningAgent, tmp_path: Path
) -> None:
    """The container's death (the agent is its first process): the call is run again in-process
    (forward answers None), since no worker is left that could still be running it."""
    started = tmp_path / "started.json"
    stdin = probe_conf("1.0.0", sleep=5, startedFile=str(started))
    thread, box = forward_in_thread(agent.sock, cni_env("ADD"), stdin)
    worker = int(str(read_json(started)["pid"]))
    for pid in (agent.pid, worker, *children_of(agent.pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert box == [None]


@pytest.mark.parametrize("command", ["DEL", "CHECK", "GC", "STATUS"])
def test_worker_killed_mid_repeatable_call_falls_back(
    agent: RunningAgent, tmp_path: Path, command: str
) -> None:
    started = tmp_path / "started.json"
    thread, box = forward_in_thread(
        agent.sock, cni_env(command), probe_conf(sleep=5, startedFile=str(started))
    )
    os.kill(int(str(read_json(started)["pid"])), signal.SIGKILL)
    thread.join(30)
    assert box == [None]


# --- try_agent, the entry points' first step ----------------------------------------------------


TRY_AGENT = """
import sys
from rdma_cni.agent.client import try_agent
code = try_agent("probe")
if code is None:
    sys.stdout.write("fallback read:" + sys.stdin.buffer.read().decode())
    code = 42
sys.exit(code)
"""


def run_try_agent(env: dict[str, str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", TRY_AGENT], input=stdin, env=env, capture_output=True, cwd=REPO, timeout=60
    )


def test_try_agent_prints_the_answer_and_its_exit_code(agent: RunningAgent) -> None:
    env = dict(cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=agent.sock)
    proc = run_try_agent(env, probe_conf(fail=True))
    assert (proc.stdout.decode(), proc.returncode) == in_process(env, probe_conf(fail=True))
    assert b"probe ADD on stderr" in proc.stderr


@pytest.mark.parametrize("why", ["no socket", "agent off", "stale socket"])
def test_try_agent_falls_back_with_stdin_intact(tmp_path: Path, why: str) -> None:
    sock = str(tmp_path / "agent.sock")
    env = dict(cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=sock)
    if why == "agent off":
        env["RDMA_CNI_AGENT"] = "off"
    if why == "stale socket":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(sock)
        s.close()  # bound, never listening: connect is refused
    proc = run_try_agent(env, probe_conf())
    assert proc.returncode == 42
    assert proc.stdout.decode() == "fallback read:" + probe_conf().decode()
