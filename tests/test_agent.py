"""rdma-agent and its thin clients, served the probe plugin of ``test_agent_probe``.

Real agent processes, real unix sockets, real namespaces, real kill -9. The probe reports where it
ran, which proves the worker takes the caller's namespaces and environment; the plugin-level tests
(identical results with the real rdma-macvlan, DEL after a crash, reconcile) are in
``test_agent_macvlan.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from netns import build_c_client, children_of, launch_agent
from netns import stop_agent as stop
from test_agent_probe import SPEC as PROBE

from rdma_cni.agent import client, wire
from rdma_cni.cni import dispatch

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
PREFIX = f"h7-{os.getpid()}-"


@dataclass
class RunningAgent:
    proc: subprocess.Popen[bytes]
    sock: str
    log: Path
    extra: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_agent(
    tmp: Path, *args: str, netns: str = "", plugins: bool = True, agent_env: dict[str, str] | None = None
) -> RunningAgent:
    sock = str(tmp / "agent.sock")
    log = tmp / "agent.log"
    opts = ["--reconcile-interval", "-1"]
    if "--prefork" not in args:
        opts += ["--prefork", "2"]  # the pool tests below count on two idle workers
    if plugins:
        opts += ["--plugin", "probe=test_agent_probe:SPEC"]
    env = dict(os.environ, PYTHONPATH=f"{TESTS}:{os.environ.get('PYTHONPATH', '')}", **(agent_env or {}))
    proc = launch_agent(sock, str(log), *opts, *args, netns=netns, env=env)
    return RunningAgent(proc, sock, log)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    running = start_agent(tmp_path)
    try:
        yield running
    finally:
        stop(running.proc)


@pytest.fixture
def netns() -> Iterator[list[str]]:
    """Make namespaces on demand (``netns.append(name)`` after ``ip netns add``); delete them all."""
    made: list[str] = []
    try:
        yield made
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def new_netns(made: list[str]) -> str:
    name = PREFIX + uuid.uuid4().hex[:8]
    subprocess.run(["ip", "netns", "add", name], check=True)
    made.append(name)
    return name


def cni_env(command: str, netns_path: str = "/var/run/netns/none", **extra: str) -> dict[str, str]:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "c0ffee",
        "CNI_NETNS": netns_path,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "H7_PROBE": "from-the-caller",
        "PATH": os.environ.get("PATH", ""),
    }
    env.update(extra)
    return env


def probe_conf(version: str = "1.1.0", **extra: object) -> bytes:
    return json.dumps({"cniVersion": version, "name": "probe-net", "type": "probe", **extra}).encode()


def in_process(env: dict[str, str], stdin: bytes) -> tuple[str, int]:
    return dispatch.run(env, stdin, PROBE)


def read_json(path: Path, timeout: float = 20.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            data: dict[str, object] = json.loads(path.read_text())
            return data
        except (FileNotFoundError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


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


def test_a_second_agent_on_the_same_socket_refuses_to_start(agent: RunningAgent) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rdma_cni.cli.agent", "--socket", agent.sock, "--reconcile-interval", "-1"],
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode != 0
    assert b"another rdma-agent" in proc.stderr
    assert os.path.exists(agent.sock)  # the first one's socket is untouched


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


# --- crashes -----------------------------------------------------------------------------------


def forward_in_thread(sock: str, env: dict[str, str], stdin: bytes) -> tuple[threading.Thread, list[object]]:
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(client.forward("probe", env, stdin, path=sock)))
    thread.start()
    return thread, box


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone (reaped) while we looked
        return True


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


def live_children(pid: int) -> set[int]:
    return {child for child in children_of(pid) if not is_zombie(child)}


def wait_for_children(pid: int, count: int, timeout: float = 20.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while len(found := live_children(pid)) != count:
        assert time.monotonic() < deadline, f"agent has {len(found)} live workers, expected {count}"
        time.sleep(0.02)
    return found


def test_while_calls_run_no_spare_is_forked_and_a_call_finding_all_busy_waits_then_gets_one(
    tmp_path: Path,
) -> None:
    """While calls run the agent forks no spare (its fork and a fresh worker's faults would take the
    CPUs the running calls need): a call that finds every worker busy waits --queue-wait for one to
    come back, then one more worker is forked for it; after the calls, PREFORK idle again."""
    running = start_agent(tmp_path, "--queue-wait", "1.5", "--trim-after", "0.5")
    # the two calls hold their workers until the third call was answered, however slow the machine
    # (6 s of sleep ran out under load before the third call had waited)
    release = tmp_path / "release"
    try:
        idle = wait_for_children(running.pid, 2)
        started1, started2 = tmp_path / "started1.json", tmp_path / "started2.json"
        slow1 = probe_conf(holdFile=str(release), startedFile=str(started1))
        slow2 = probe_conf(holdFile=str(release), startedFile=str(started2))
        first, box1 = forward_in_thread(running.sock, cni_env("ADD"), slow1)
        busy1 = int(str(read_json(started1)["pid"]))
        second, box2 = forward_in_thread(running.sock, cni_env("DEL"), slow2)
        busy2 = int(str(read_json(started2)["pid"]))
        assert {busy1, busy2} == idle
        deadline = time.monotonic() + 1.0  # the old refill forked a spare within milliseconds
        while time.monotonic() < deadline:
            assert live_children(running.pid) == idle, "a spare worker was forked while calls ran"
            time.sleep(0.01)
        marker = tmp_path / "third.json"
        t0 = time.monotonic()
        answer = client.forward(
            "probe", cni_env("CHECK"), probe_conf(probeFile=str(marker)), 30, running.sock
        )
        waited = time.monotonic() - t0
        assert answer is not None and answer.code == 0
        assert int(str(read_json(marker)["pid"])) not in idle  # a fresh worker, forked for it
        assert waited >= 1.4, f"served after {waited:.2f} s: it did not wait for a busy worker"
        assert "a call waited" in running.log.read_text()
        release.touch()
        first.join(30)
        second.join(30)
        assert [type(box1[0]), type(box2[0])] == [client.Answer, client.Answer]
        wait_for_children(running.pid, 2, timeout=20)
    finally:
        release.touch()
        stop(running.proc)


def test_a_call_waiting_while_a_worker_waits_on_a_plugin_it_ran_gets_a_worker_at_once(
    tmp_path: Path,
) -> None:
    """A busy worker waiting on a child process (a delegate it ran, which may itself be the call
    waiting in the agent's backlog) must not make that call wait --queue-wait: one more worker at
    once, or multus -> rdma-macvlan through the agent would queue behind itself."""
    running = start_agent(tmp_path, "--prefork", "1", "--queue-wait", "20")
    started, release = tmp_path / "started.json", tmp_path / "release"
    try:
        wait_for_children(running.pid, 1)
        nested, box = forward_in_thread(
            running.sock, cni_env("ADD"), probe_conf(childHoldFile=str(release), startedFile=str(started))
        )
        worker = int(str(read_json(started)["pid"]))
        deadline = time.monotonic() + 20
        while not children_of(worker):  # its child runs now (the event the agent looks for)
            assert time.monotonic() < deadline, "the worker never started its child"
            time.sleep(0.01)
        t0 = time.monotonic()
        answer = client.forward("probe", cni_env("CHECK"), probe_conf(), 30, running.sock)
        assert answer is not None and answer.code == 0
        assert time.monotonic() - t0 < 10, "the call waited for the worker that waits on its child"
        assert "waits on a plugin it ran" in running.log.read_text()
        release.touch()
        nested.join(30)
        assert type(box[0]) is client.Answer
    finally:
        release.touch()
        stop(running.proc)


def test_client_that_gives_up_before_go_never_has_the_call_run(agent: RunningAgent, tmp_path: Path) -> None:
    marker = tmp_path / "ran.json"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(agent.sock)
        client._send_request(sock, "probe", cni_env("ADD"), probe_conf(probeFile=str(marker)))
        assert sock.recv(1) == wire.READY
    time.sleep(0.5)
    assert not marker.exists()


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


# --- the C client ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("c-client")
    build_c_client(str(out))
    (out / "probe").symlink_to("rdma-cni-client")
    fallback = out / "fallback.sh"
    fallback.write_text(
        '#!/bin/sh\nprintf "fallback agent=%s argv0=%s stdin=" "$RDMA_CNI_AGENT" "$0"\ncat\nexit 42\n'
    )
    fallback.chmod(0o755)
    return out


def run_c(c_client: Path, env: dict[str, str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    env = dict(env, RDMA_CNI_FALLBACK=str(c_client / "fallback.sh"))
    return subprocess.run([str(c_client / "probe")], input=stdin, env=env, capture_output=True, timeout=60)


@pytest.mark.parametrize("command,fail", [("ADD", False), ("ADD", True), ("DEL", False), ("VERSION", False)])
def test_c_client_answer_equals_the_in_process_answer(
    agent: RunningAgent, c_client: Path, command: str, fail: bool
) -> None:
    env = dict(cni_env(command), RDMA_CNI_AGENT_SOCKET=agent.sock)
    stdin = probe_conf(fail=fail) if fail else probe_conf()
    proc = run_c(c_client, env, stdin)
    assert (proc.stdout.decode(), proc.returncode) == in_process(env, stdin)
    if command != "VERSION":
        assert f"probe {command} on stderr".encode() in proc.stderr


def test_c_client_worker_runs_with_the_callers_environment(
    agent: RunningAgent, c_client: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "where.json"
    env = dict(cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=agent.sock, H7_PROBE="via C")
    assert run_c(c_client, env, probe_conf(probeFile=str(marker))).returncode == 0
    where = read_json(marker)
    assert where["env"] == "via C"
    assert where["net"] == os.stat("/proc/self/ns/net").st_ino


@pytest.mark.parametrize("why", ["no socket", "agent off", "unknown plugin"])
def test_c_client_falls_back_with_stdin_intact(
    agent: RunningAgent, c_client: Path, tmp_path: Path, why: str
) -> None:
    env = dict(cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=agent.sock)
    if why == "no socket":
        env["RDMA_CNI_AGENT_SOCKET"] = str(tmp_path / "absent.sock")
    if why == "agent off":
        env["RDMA_CNI_AGENT"] = "off"
    stdin = probe_conf()
    exe = c_client / "probe"
    if why == "unknown plugin":
        exe = tmp_path / "not-served"
        exe.symlink_to(c_client / "rdma-cni-client")
    proc = subprocess.run(
        [str(exe)],
        input=stdin,
        env=dict(env, RDMA_CNI_FALLBACK=str(c_client / "fallback.sh")),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 42
    assert (
        proc.stdout.decode() == f"fallback agent=off argv0={c_client / 'fallback.sh'} stdin=" + stdin.decode()
    )


def test_c_client_worker_killed_mid_add_answers_try_again_later(
    agent: RunningAgent, c_client: Path, tmp_path: Path
) -> None:
    started = tmp_path / "started.json"
    env = dict(
        cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=agent.sock, RDMA_CNI_FALLBACK=str(c_client / "fallback.sh")
    )
    proc = subprocess.Popen(
        [str(c_client / "probe")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None
    proc.stdin.write(probe_conf("0.4.0", sleep=5, startedFile=str(started)))
    proc.stdin.close()
    os.kill(int(str(read_json(started)["pid"])), signal.SIGKILL)
    assert proc.stdout is not None
    out = proc.stdout.read()
    assert proc.wait(timeout=30) == 1
    err = json.loads(out)
    assert (err["code"], err["cniVersion"]) == (11, "0.4.0")


# --- memory ------------------------------------------------------------------------------------


def _private_dirty_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return 0


def test_the_default_pool_is_prefork_idle_workers_and_only_warm_workers_hold_the_hot_pages(
    tmp_path: Path,
) -> None:
    """A burst of PREFORK calls finds a worker each without a fork; after it, the pool is PREFORK
    idle workers again, of which at most WARM_WORKERS hold the pages calls write (the others were
    replaced by shallow forks that share every page with the agent)."""
    import re

    from rdma_cni.agent.server import PREFORK, WARM_WORKERS

    running = start_agent(tmp_path, "--prefork", str(PREFORK), "--trim-after", "0.5")
    try:
        idle = wait_for_children(running.pid, PREFORK)
        first = client.forward("probe", cni_env("VERSION"), probe_conf(), 60, running.sock)
        assert isinstance(first, client.Answer) and first.code == 0
        deadline = time.monotonic() + 30
        while not (found := re.findall(r"calls write ([0-9.]+) MiB", running.log.read_text())):
            assert time.monotonic() < deadline, "the agent never learned which pages calls write"
            time.sleep(0.05)
        hot_kib = int(float(found[-1]) * 1024)
        # the first pool (forked before the agent knew what to copy) is retired but for the worker
        # that served: wait for that, not a second's sleep (not an assertion: at most 30 s)
        first_pool, deadline = idle, time.monotonic() + 30
        while time.monotonic() < deadline:
            live = live_children(running.pid)
            if len(live) == PREFORK and len(live & first_pool) <= 1:
                break
            time.sleep(0.02)
        idle = wait_for_children(running.pid, PREFORK)
        answers: list[object] = []
        marks = [tmp_path / f"burst{i}.json" for i in range(PREFORK)]
        meet = tmp_path / "burst-barrier"  # all PREFORK calls run at once, however slow the machine
        calls = [
            threading.Thread(
                target=lambda m=m: answers.append(
                    client.forward(
                        "probe",
                        cni_env("ADD"),
                        probe_conf(barrier=str(meet), barrierCount=PREFORK, probeFile=str(m)),
                        30,
                        running.sock,
                    )
                )
            )
            for m in marks
        ]
        for t in calls:
            t.start()
        for t in calls:
            t.join()
        assert all(isinstance(a, client.Answer) and a.code == 0 for a in answers)
        served = {int(str(read_json(m)["pid"])) for m in marks}
        assert served <= idle, "a call of the burst waited for a fork"
        deadline = time.monotonic() + 30
        while True:
            pids = live_children(running.pid)
            warm = {p for p in pids if _private_dirty_kib(p) >= hot_kib * 3 // 4}
            if len(pids) == PREFORK and len(warm) <= WARM_WORKERS:
                break
            assert time.monotonic() < deadline, (len(pids), len(warm), hot_kib)
            time.sleep(0.1)
    finally:
        stop(running.proc)


def test_agent_rss_with_the_plugin_stack_loaded_is_inside_the_daemonset_limit(tmp_path: Path) -> None:
    running = start_agent(tmp_path)  # default plugins: rdma-macvlan and rdma-multus, preloaded
    try:
        with open(f"/proc/{running.pid}/status") as f:
            rss_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        print(f"rdma-agent RSS: {rss_kib / 1024:.1f} MiB; log: {running.log.read_text()[-400:]}")
        assert rss_kib < 500 * 1024  # the seed's DaemonSet memory limit, 500Mi
    finally:
        stop(running.proc)


def test_c_client_in_a_bundle_falls_back_to_the_bundle_program_by_its_own_name(tmp_path: Path) -> None:
    """scripts/build-client --bundle: rdma-macvlan -> rdma-cni-client, which execs ./rdma-cni as
    rdma-macvlan (the multicall bundle dispatches on argv[0]) when no agent answers."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    # A compiled stand-in: a script's interpreter would see the script path as argv[0], not ours.
    source = tmp_path / "standin.c"
    source.write_text(
        "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
        "int main(int c, char **v) { (void)c; const char *b = strrchr(v[0], '/');"
        ' printf("%s|%s|", b ? b + 1 : v[0], getenv("RDMA_CNI_AGENT")); int ch;'
        " while ((ch = getchar()) != EOF) putchar(ch); return 0; }\n"
    )
    subprocess.run(["cc", "-o", str(bundle / "rdma-cni"), str(source)], check=True)
    (bundle / "rdma-macvlan").symlink_to("rdma-cni")
    subprocess.run(
        [str(REPO / "scripts" / "build-client"), "--bundle", str(bundle)], check=True, capture_output=True
    )
    assert os.readlink(bundle / "rdma-macvlan") == "rdma-cni-client"
    assert os.readlink(bundle / "rdma-multus") == "rdma-cni-client"
    link_dir = tmp_path / "opt-cni-bin"  # installed as a link elsewhere, like /opt/cni/bin/rdma-macvlan
    link_dir.mkdir()
    (link_dir / "rdma-macvlan").symlink_to(bundle / "rdma-macvlan")
    env = dict(cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=str(tmp_path / "absent.sock"))
    proc = subprocess.run([str(link_dir / "rdma-macvlan")], input=probe_conf(), env=env, capture_output=True)
    assert proc.stdout.decode() == "rdma-macvlan|off|" + probe_conf().decode()


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


# --- workers that serve several calls ----------------------------------------------------------


def _call_from(netns_name: str, sock: str, marker: Path, **conf: object) -> tuple[int, int, int]:
    """A probe ADD from a caller in ``netns_name`` (``ip netns exec``: its own mounts too), or from
    this test process when empty. Returns (exit code, caller's net inode, caller's mnt inode)."""
    stdin = probe_conf("1.1.0", probeFile=str(marker), **conf)
    if not netns_name:
        answer = client.forward("probe", cni_env("ADD"), stdin, path=sock)
        assert answer is not None
        return answer.code, os.stat("/proc/self/ns/net").st_ino, os.stat("/proc/self/ns/mnt").st_ino
    script = (
        "import json,os; from rdma_cni.agent import client; "
        f"a = client.forward('probe', {cni_env('ADD')!r}, {stdin!r}, path={sock!r}); "
        "print(json.dumps([a.code if a else -1, os.stat('/proc/self/ns/net').st_ino, "
        "os.stat('/proc/self/ns/mnt').st_ino]))"
    )
    out = subprocess.run(
        ["ip", "netns", "exec", netns_name, sys.executable, "-c", script],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    code, net, mnt = json.loads(out.stdout)
    return int(code), int(net), int(mnt)


def test_a_worker_serves_calls_one_after_another_each_in_its_callers_namespaces(
    tmp_path: Path, netns: list[str]
) -> None:
    """Callers alternate between this process (the agent's own mounts, which a worker does not
    join again) and another netns (with its own mounts): a worker serves several of them, and each
    call still runs exactly where its caller is, so a worker went home after each call."""
    running = start_agent(tmp_path, "--prefork", "1")  # one idle worker: it takes every next call
    other = new_netns(netns)
    try:
        pids = []
        for i, caller in enumerate(["", other] * 4):
            marker = tmp_path / f"call{i}.json"
            code, net, mnt = _call_from(caller, running.sock, marker)
            where = read_json(marker)
            assert code == 0 and (where["net"], where["mnt"], where["cwd"]) == (net, mnt, "/"), i
            pids.append(where["pid"])
            time.sleep(0.1)  # the spare forked during the call is trimmed again
        # Consecutive calls of the same worker came from different namespaces.
        assert any(a == b for a, b in itertools.pairwise(pids)), pids
        assert "exits after its call" not in running.log.read_text()
    finally:
        stop(running.proc)


@pytest.mark.parametrize("leak,why", [({"leakFd": True}, "descriptor"), ({"leaveThread": 5}, "thread")])
def test_a_call_that_leaves_something_behind_ends_its_worker(
    tmp_path: Path, leak: dict[str, object], why: str
) -> None:
    running = start_agent(tmp_path, "--prefork", "1")
    try:
        marker = tmp_path / "leak.json"
        assert _call_from("", running.sock, marker, **leak)[0] == 0
        leaker = int(read_json(marker)["pid"])  # type: ignore[call-overload]
        deadline = time.monotonic() + 10
        while not is_zombie(leaker) and time.monotonic() < deadline:  # gone, or exited and not reaped
            time.sleep(0.02)
        assert is_zombie(leaker)
        assert f"worker {leaker} exits after its call: the call left 1 {why}" in running.log.read_text()
        for i in range(3):  # the calls after it are served as usual
            marker = tmp_path / f"after{i}.json"
            assert _call_from("", running.sock, marker)[0] == 0
            assert read_json(marker)["pid"] != leaker
    finally:
        stop(running.proc)


def test_calls_per_worker_bounds_how_many_calls_a_worker_serves(tmp_path: Path) -> None:
    running = start_agent(tmp_path, "--calls-per-worker", "2")
    try:
        pids: dict[object, int] = {}
        for i in range(8):
            marker = tmp_path / f"n{i}.json"
            assert _call_from("", running.sock, marker)[0] == 0
            pid = read_json(marker)["pid"]
            pids[pid] = pids.get(pid, 0) + 1
        assert max(pids.values()) == 2, pids
    finally:
        stop(running.proc)


def test_after_a_burst_the_surplus_idle_workers_leave_and_no_call_is_lost(tmp_path: Path) -> None:
    running = start_agent(tmp_path)
    try:
        results: list[object] = []
        meet = str(tmp_path / "barrier")  # the six calls run at once, however slow the machine
        calls = [
            threading.Thread(
                target=lambda i=i: results.append(
                    client.forward(
                        "probe",
                        cni_env("ADD"),
                        probe_conf(barrier=meet, barrierCount=6, probeFile=str(tmp_path / f"b{i}.json")),
                        path=running.sock,
                    )
                )
            )
            for i in range(6)
        ]
        for t in calls:
            t.start()
        for t in calls:
            t.join()
        assert len(results) == 6 and all(a is not None and a.code == 0 for a in results)  # type: ignore[attr-defined]
        served = {read_json(tmp_path / f"b{i}.json")["pid"] for i in range(6)}
        assert len(served) == 6
        wait_for_children(running.pid, 2, timeout=10)  # prefork idle workers, no more
        marker = tmp_path / "after.json"
        assert _call_from("", running.sock, marker)[0] == 0
        assert read_json(marker)["pid"] in served  # a kept worker is one that had served (warm)
    finally:
        stop(running.proc)


def test_back_to_back_bursts_while_surplus_workers_are_trimmed_lose_no_call(tmp_path: Path) -> None:
    """Each burst forks workers beyond PREFORK and the next one starts while the surplus is being
    told to leave: every call must still be answered by the agent (a worker that took a connection
    serves it; one told to leave while waiting takes none). Lost 2 of 240 when the SIGTERM handler
    could fire between accept() and the call being noted."""
    running = start_agent(tmp_path)
    try:
        answers: list[object] = []
        for _ in range(30):
            calls = [
                threading.Thread(
                    target=lambda: answers.append(
                        client.forward("probe", cni_env("DEL"), probe_conf(sleep=0.02), 30, running.sock)
                    )
                )
                for _ in range(8)
            ]
            for t in calls:
                t.start()
            for t in calls:
                t.join()
        assert len(answers) == 240
        assert [a for a in answers if not isinstance(a, client.Answer) or a.code != 0] == []
    finally:
        stop(running.proc)


def _burst(sock: str, tmp: Path, tag: str, n: int = 6) -> set[int]:
    """n overlapping calls; the pids of the workers that served them.

    Each call holds its worker until all n have arrived at a barrier, so the n calls overlap however
    long starting a thread or forking a worker takes on a loaded machine (a 0.5 s, later 2 s, sleep
    let a worker finish and be reused under load).
    """
    answers: list[object] = []

    def call(i: int) -> None:
        stdin = probe_conf(
            barrier=str(tmp / f"{tag}-barrier"), barrierCount=n, probeFile=str(tmp / f"{tag}{i}.json")
        )
        answers.append(client.forward("probe", cni_env("ADD"), stdin, 30, sock))

    calls = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    assert len(answers) == n and all(isinstance(a, client.Answer) and a.code == 0 for a in answers)
    return {int(str(read_json(tmp / f"{tag}{i}.json")["pid"])) for i in range(n)}


def test_workers_left_from_a_burst_serve_the_next_burst_then_leave(tmp_path: Path) -> None:
    """Surplus idle workers stay --trim-after seconds: a second burst right after the first is
    served by the first one's (warm) workers, no fork; later only PREFORK idle workers remain."""
    running = start_agent(tmp_path, "--trim-after", "12", "--log-level", "debug")
    try:
        first = _burst(running.sock, tmp_path, "a")
        assert len(first) == 6
        kept = live_children(running.pid)
        assert first <= kept  # the burst's workers stay (plus, maybe, the spare forked during it)
        # The second burst starts once the agent knows every worker of the first is back waiting
        # (its debug line): a worker still finishing its call when a call of the second burst
        # arrives makes that call wait --queue-wait (25 ms), then get a fork, which is not the
        # trim this test is about (a loaded run saw it).
        back = [f"worker {pid} is waiting for a call again" for pid in sorted(first)]
        deadline = time.monotonic() + 30
        while not all(line in running.log.read_text() for line in back):
            assert time.monotonic() < deadline, running.log.read_text()[-2000:]
            time.sleep(0.02)
        second = _burst(running.sock, tmp_path, "b")
        assert second <= kept, "the second burst waited for forks"
        wait_for_children(running.pid, 2, timeout=60)
    finally:
        stop(running.proc)
