"""A rolling update's hand-over between two rdma-agents of one node (rdma_cni/agent/handover.py,
the metrics port's SO_REUSEPORT): the DaemonSet's surge pod starts the new agent while the old one
serves.

Real agent processes on a real unix socket, the probe plugin of ``test_agent_probe``, real kill -9;
the metrics port is bound only inside a network namespace the test made.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import probe_agent
import pytest
from netns import launch_agent
from netns import stop_agent as stop
from probe_agent import RunningAgent, cni_env, forward_in_thread, new_netns, probe_conf, read_json

from rdma_cni.agent import client

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
agent = probe_agent.agent


def start_second(first: RunningAgent, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The next agent on the first one's socket (same options), its log apart."""
    log = tmp_path / "second.log"
    env = dict(os.environ, PYTHONPATH=f"{probe_agent.PROBE_DIR}:{probe_agent.TESTS}")
    cmd = [sys.executable, "-m", "rdma_cni.cli.agent", "--socket", first.sock, "--reconcile-interval", "-1",
           "--prefork", "2", "--plugin", "probe=test_agent_probe:SPEC", "--log-level", "info"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, cwd=REPO)
    return proc, log


def wait_for(what: str, check: object, timeout: float = 120.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.05)


def inode(path: str) -> tuple[int, int] | None:
    """The file's identity: its inode number and change time (tmpfs reuses a freed number at once)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


def answers(sock: str) -> bool:
    proc = subprocess.run([sys.executable, "-m", "rdma_cni.cli.agent", "--probe", "--socket", sock],
                          capture_output=True, cwd=REPO, timeout=60)
    return proc.returncode == 0


@pytest.fixture
def second(agent: RunningAgent, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    proc, log = start_second(agent, tmp_path)
    try:
        wait_for("the second agent says it waits", lambda: "waiting until it" in log.read_text())
        yield proc, log
    finally:
        stop(proc)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_the_next_agent_waits_warm_then_takes_the_socket_when_the_running_one_ends(
    agent: RunningAgent, second: tuple[subprocess.Popen[bytes], Path], how: signal.Signals
) -> None:
    proc, log = second
    first_inode = inode(agent.sock)
    time.sleep(1.0)
    assert proc.poll() is None, "the second agent gave up instead of waiting"
    assert inode(agent.sock) == first_inode, "the waiting agent replaced the running one's socket"
    assert answers(agent.sock)
    os.kill(agent.pid, how)
    agent.proc.wait(30)
    wait_for("the second agent serves the socket", lambda: inode(agent.sock) not in (None, first_inode), 30)
    assert answers(agent.sock)
    assert proc.poll() is None
    assert "taking over" in log.read_text()


def test_a_call_the_old_agent_runs_ends_before_the_new_one_takes_over(
    agent: RunningAgent, second: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    """The old agent's busy worker keeps the lock (a fork shares it) until its call answered."""
    started, done = tmp_path / "started.json", tmp_path / "done.json"
    conf = probe_conf(sleep=2.0, startedFile=str(started), probeFile=str(done))
    thread, box = forward_in_thread(agent.sock, cni_env("ADD"), conf)
    read_json(started)
    first_inode = inode(agent.sock)
    os.kill(agent.pid, signal.SIGTERM)
    thread.join(30)
    answer = box[0]
    assert isinstance(answer, client.Answer) and answer.code == 0, answer
    assert done.exists()
    wait_for("the second agent serves the socket", lambda: inode(agent.sock) not in (None, first_inode), 30)
    assert answers(agent.sock)


def test_two_agents_share_the_metrics_port_and_another_program_cannot() -> None:
    made: list[str] = []
    try:
        ns = new_netns(made)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        script = (
            "import socket\n"
            "from rdma_cni.agent.metrics.address import listen\n"
            "a = listen('127.0.0.1:9513'); b = listen('127.0.0.1:9513')\n"
            "print(a.getsockname()[1], b.getsockname()[1])\n"
            "a.close(); b.close()\n"
            "plain = socket.socket(); plain.bind(('127.0.0.1', 9513)); plain.listen(1)\n"
            "try:\n"
            "    listen('127.0.0.1:9513')\n"
            "except OSError as e:\n"
            "    print('refused', e.errno)\n"
        )
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", script], capture_output=True,
                             text=True, cwd=REPO, timeout=60, check=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
        lines = out.stdout.split("\n")
        assert lines[0] == "9513 9513"
        assert lines[1] == f"refused {errno.EADDRINUSE}"
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "delete", ns], check=False)


def test_the_waiting_agent_ends_on_sigterm_and_leaves_the_running_one_alone(
    agent: RunningAgent, second: tuple[subprocess.Popen[bytes], Path]
) -> None:
    """A surge pod deleted before the old one stopped: nothing of it stays, the old agent serves on."""
    proc, _ = second
    first_inode = inode(agent.sock)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == -signal.SIGTERM
    assert inode(agent.sock) == first_inode and answers(agent.sock)


def test_a_metrics_port_the_previous_agent_still_holds_is_tried_again_until_free(tmp_path: Path) -> None:
    """A previous build's agent bound the port without SO_REUSEPORT and lets it go a moment after its
    lock: the new agent tries again (up to METRICS_BIND_WAIT) instead of exiting."""
    made: list[str] = []
    agent_proc = None
    try:
        ns = new_netns(made)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        hold = ("import socket, sys, time\n"
                "s = socket.socket(); s.bind(('127.0.0.1', 9513)); s.listen(1)\n"
                "print('held', flush=True); time.sleep(2.0)\n")
        holder = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", hold],
                                  stdout=subprocess.PIPE)
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        sock, log = str(tmp_path / "agent.sock"), tmp_path / "agent.log"
        agent_proc = launch_agent(sock, str(log), "--reconcile-interval", "-1", "--prefork", "1",
                                  "--metrics-address", "127.0.0.1:9513", netns=ns)
        assert holder.wait(10) == 0
        assert agent_proc.poll() is None, log.read_text()
        probe = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c",
                                "import urllib.request; print(urllib.request.urlopen("
                                "'http://127.0.0.1:9513/metrics', timeout=10).status)"],
                               capture_output=True, text=True, timeout=60)
        assert probe.stdout.strip() == "200", probe.stderr
    finally:
        if agent_proc is not None:
            stop(agent_proc)
        for name in made:
            subprocess.run(["ip", "netns", "delete", name], check=False)
