"""The real rdma-macvlan served by rdma-agent: same results as in-process, crash safety, reconcile.

The agent runs inside the node netns (as the DaemonSet runs in the node's), the plugin is called
through the C thin client (fallback disabled where the test must prove the agent answered) and, when
the Python entry point forwards to the agent, through it too. Veth ends stand in for bonds
(``rdma.required: false``); the node's addresses, routes and rules are compared before and after.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netns as netns_fixtures
import pytest
from netns import (
    Node,
    PluginResult,
    Pod,
    build_c_client,
    can_run,
    children_of,
    launch_agent,
    node,
    stop_agent,
)

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def n(monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    reason = can_run()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(netns_fixtures, "PREFIX", "h7-")  # this helper's namespaces carry h7-
    with node() as made:
        made.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
        made.bond("bond1", "198.51.100.18/28", "198.51.100.19/28", peer="198.51.100.17/28")
        made.ip("route", "add", "203.0.113.0/28", "via", "198.51.100.1")
        yield made


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("c-client")
    build_c_client(str(out))
    (out / "rdma-macvlan").symlink_to("rdma-cni-client")
    cold = out / "cold-rdma-macvlan"
    cold.write_text(f"#!/bin/sh\nexec {sys.executable} -m rdma_cni.cli.macvlan\n")
    cold.chmod(0o755)
    return out


class Agent:
    def __init__(self, n: Node, *args: str) -> None:
        self.sock = os.path.join(n.tmp, "agent.sock")
        self.conf_file = os.path.join(n.tmp, "net.conf")
        with open(self.conf_file, "w") as f:
            json.dump(n.config(), f)
        self.log = os.path.join(n.tmp, "agent.log")
        self.proc = launch_agent(
            self.sock, self.log, "--conf", self.conf_file, "--cni-path", "/usr/lib/cni", *args, netns=n.name
        )

    def stop(self) -> None:
        stop_agent(self.proc)


@pytest.fixture
def agent(n: Node) -> Iterator[Agent]:
    a = Agent(n, "--reconcile-interval", "-1")
    try:
        yield a
    finally:
        a.stop()


def warm(
    n: Node,
    c_client: Path,
    agent_sock: str,
    command: str,
    conf: dict[str, Any],
    pod: Pod | str | None,
    container_id: str = "c1",
    extra: dict[str, str] | None = None,
    fallback: str = "/bin/false",
) -> PluginResult:
    """Through the C client; with the default fallback any call the agent did not answer fails."""
    env = n.env(
        command,
        pod,
        container_id,
        "net1",
        {"RDMA_CNI_AGENT_SOCKET": agent_sock, "RDMA_CNI_FALLBACK": fallback, **(extra or {})},
    )
    proc = subprocess.run(
        ["ip", "netns", "exec", n.name, str(c_client / "rdma-macvlan")],
        input=json.dumps(conf).encode(),
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return netns_fixtures._result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def cold(
    n: Node,
    command: str,
    conf: dict[str, Any],
    pod: Pod | str | None,
    container_id: str = "c1",
) -> PluginResult:
    return n.plugin(command, conf, pod, container_id=container_id, extra={"RDMA_CNI_AGENT": "off"})


def without_macs(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(result))
    for iface in out.get("interfaces", []):
        iface.pop("mac", None)
    return out


def cycle(
    run: Any, n: Node, pod: Pod, cid: str
) -> tuple[PluginResult, dict[str, Any], PluginResult, PluginResult]:
    conf = n.config(masters=["bond1"])
    add = run("ADD", conf, pod, cid)
    assert add.code == 0, add.stdout + add.stderr
    during = n.snapshot()
    check = run("CHECK", dict(conf, prevResult=add.out), pod, cid)
    dele = run("DEL", dict(conf, prevResult=add.out), pod, cid)
    return add, during, check, dele


def test_agent_and_in_process_give_the_same_results_and_host_changes(
    n: Node, agent: Agent, c_client: Path
) -> None:
    before = n.snapshot()

    def via_agent(command: str, conf: dict[str, Any], pod: Pod, cid: str) -> PluginResult:
        return warm(n, c_client, agent.sock, command, conf, pod, cid)

    def in_process(command: str, conf: dict[str, Any], pod: Pod, cid: str) -> PluginResult:
        return cold(n, command, conf, pod, cid)

    pod_a, pod_b = n.pod(), n.pod()
    add_c, during_c, check_c, del_c = cycle(in_process, n, pod_a, "same-id")
    assert n.snapshot() == before
    add_w, during_w, check_w, del_w = cycle(via_agent, n, pod_b, "same-id")
    assert n.snapshot() == before
    # Same result except the kernel-chosen MAC and the pod's netns path.
    assert without_macs(add_w.out) == json.loads(
        json.dumps(without_macs(add_c.out)).replace(pod_a.name, pod_b.name)
    )
    assert during_w == during_c  # the bond lost the same addresses and routes either way
    assert (check_w.code, check_w.stdout, del_w.code, del_w.stdout) == (check_c.code, check_c.stdout, 0, "")
    assert del_c.code == 0
    # The agent's warm-up covers the plugin path: no worker imported a module during its call.
    served = [line for line in Path(agent.log).read_text().splitlines() if "served rdma-macvlan" in line]
    assert len(served) == 3, served
    assert not [line for line in served if "did not warm" in line], served


@pytest.mark.parametrize(
    "case",
    ["no such master", "bad config type", "CHECK without ADD", "VERSION", "STATUS"],
)
def test_agent_and_in_process_give_the_same_errors(n: Node, agent: Agent, c_client: Path, case: str) -> None:
    pod = n.pod()
    command, conf = {
        "no such master": ("ADD", n.config(masters=["bond9"])),
        "bad config type": ("ADD", n.config(mtu="big")),
        "CHECK without ADD": ("CHECK", n.config(masters=["bond0"])),
        "VERSION": ("VERSION", n.config()),
        "STATUS": ("STATUS", n.config(cniVersion="1.1.0", masters=["bond0"])),
    }[case]
    w = warm(n, c_client, agent.sock, command, conf, pod)
    c = cold(n, command, conf, pod)
    assert (w.code, w.stdout) == (c.code, c.stdout)


@pytest.mark.parametrize("why", ["agent never started", "agent stopped", "agent killed"])
def test_agent_down_the_client_runs_the_plugin_in_process_with_the_same_result(
    n: Node, c_client: Path, why: str
) -> None:
    sock = os.path.join(n.tmp, "agent.sock")
    if why != "agent never started":
        a = Agent(n, "--reconcile-interval", "-1")
        if why == "agent stopped":
            a.stop()
        else:
            os.kill(a.proc.pid, signal.SIGKILL)  # leaves a stale socket behind
            a.proc.wait()
            assert os.path.exists(sock)
    before = n.snapshot()
    pod = n.pod()
    fallback = str(c_client / "cold-rdma-macvlan")
    conf = n.config(masters=["bond0"])
    add = warm(n, c_client, sock, "ADD", conf, pod, fallback=fallback)
    assert add.code == 0, add.stdout + add.stderr
    assert n.pod_json(pod, "addr") and "198.51.100.2/28" in json.dumps(add.out)
    assert n.ping(pod, "198.51.100.1", "bond0")
    dele = warm(n, c_client, sock, "DEL", conf, pod, fallback=fallback)
    assert dele.code == 0
    assert n.snapshot() == before


def test_agent_killed_mid_add_the_call_completes_and_del_restores(
    n: Node, agent: Agent, c_client: Path
) -> None:
    before = n.snapshot()
    pod = n.pod()
    conf = n.config(masters=["bond0"])
    with node_lock_held(n):
        env = n.env(
            "ADD", pod, "c1", "net1", {"RDMA_CNI_AGENT_SOCKET": agent.sock, "RDMA_CNI_FALLBACK": "/bin/false"}
        )
        proc = start_client(n, c_client, env, conf)
        time.sleep(1.0)  # connected, GO sent, worker blocked on the lock
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "198.51.100.2/28" in out.decode()
    assert n.ping(pod, "198.51.100.1", "bond0")
    dele = cold(n, "DEL", conf, pod)
    assert dele.code == 0
    assert n.snapshot() == before


def test_agent_dying_with_its_workers_mid_add_the_add_runs_again_in_process(
    n: Node, agent: Agent, c_client: Path
) -> None:
    """In a DaemonSet the agent is its container's first process: a kill -9 of it takes every worker
    with it. The ADD a worker was running is then run again in-process at once (undoing what the
    dead worker recorded first), instead of failing with 11 and waiting for kubelet's retry (17 s on
    the test cluster under upstream Multus)."""
    before = n.snapshot()
    pod = n.pod()
    conf = n.config(masters=["bond0"])
    with node_lock_held(n) as inode:
        fallback = str(c_client / "cold-rdma-macvlan")
        extra = {"RDMA_CNI_AGENT_SOCKET": agent.sock, "RDMA_CNI_FALLBACK": fallback}
        env = n.env("ADD", pod, "c1", "net1", extra)
        proc = start_client(n, c_client, env, conf)
        assert wait_for(lambda: _waits_for_lock(inode), 60), "no worker reached the node lock"
        for pid in [agent.proc.pid, *worker_pids(agent)]:  # what the runtime does when PID 1 dies
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        agent.proc.wait()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert b"died during ADD, its workers with it: running the call in-process" in err
    assert "198.51.100.2/28" in out.decode()
    assert n.ping(pod, "198.51.100.1", "bond0")
    assert cold(n, "DEL", conf, pod).code == 0
    assert n.snapshot() == before and n.state_files() == []


@contextlib.contextmanager
def node_lock_held(n: Node) -> Iterator[int]:
    """Hold the plugin's node lock, so that a worker's ADD stops there, mid-call; yields the lock
    file's inode (what /proc/locks names it by)."""
    import fcntl

    os.makedirs(n.data_dir, mode=0o700, exist_ok=True)
    lock = os.open(os.path.join(n.data_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield os.fstat(lock).st_ino
    finally:
        os.close(lock)


def _waits_for_lock(inode: int) -> bool:
    """Someone is blocked on the lock file (``/proc/locks`` shows a waiter as ``->``): the worker
    has its GO and is inside the plugin's ADD."""
    with open("/proc/locks") as f:
        return any("->" in line and line.split()[6].endswith(f":{inode}") for line in f)


@pytest.mark.parametrize(
    "step",
    ["write-ahead", "link-created", "addresses-removed", "addresses-added", "routes-added", "committed"],
)
def test_worker_killed_at_each_add_step_fails_cleanly_and_del_restores(
    n: Node, agent: Agent, c_client: Path, step: str
) -> None:
    before = n.snapshot()
    pod = n.pod()
    conf = n.config(masters=["bond1"])
    add = warm(n, c_client, agent.sock, "ADD", conf, pod, extra={"RDMA_CNI_FAILPOINT": step})
    assert add.code == 1 and add.out["code"] == 11, add.stdout
    dele = warm(n, c_client, agent.sock, "DEL", conf, pod)  # the runtime's DEL after a failed ADD
    assert dele.code == 0, dele.stdout
    assert n.snapshot() == before
    assert n.state_files() == []


@pytest.mark.slow
def test_worker_killed_at_random_moments_then_del_restores_every_time(
    n: Node, agent: Agent, c_client: Path
) -> None:
    # Killing idle workers too: one that was already dying may still take the next connection and
    # drop it before READY, so the client falls back in-process (the real plugin here), as designed.
    cold_plugin = str(c_client / "cold-rdma-macvlan")
    before = n.snapshot()
    conf = n.config(masters=["bond1"])
    rng = random.Random(7)
    for i in range(12):
        pod = n.pod()
        env = n.env(
            "ADD",
            pod,
            f"r{i}",
            "net1",
            {"RDMA_CNI_AGENT_SOCKET": agent.sock, "RDMA_CNI_FALLBACK": cold_plugin},
        )
        proc = start_client(n, c_client, env, conf)
        time.sleep(rng.uniform(0.0, 0.25))
        for pid in worker_pids(agent):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # finished its call in the meantime
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode in (0, 1), out
        if proc.returncode == 1:
            assert json.loads(out)["code"] == 11
        dele = warm(n, c_client, agent.sock, "DEL", conf, pod, container_id=f"r{i}", fallback=cold_plugin)
        assert dele.code == 0, dele.stdout + open(agent.log).read()[-3000:]
        assert n.snapshot() == before, f"round {i}"
        n.delete_pod(pod)


def start_client(
    n: Node, c_client: Path, env: dict[str, str], conf: dict[str, Any]
) -> subprocess.Popen[bytes]:
    stdin = Path(n.tmp) / f"stdin-{time.monotonic_ns()}.json"
    stdin.write_text(json.dumps(conf))
    with open(stdin, "rb") as f:
        return subprocess.Popen(
            ["ip", "netns", "exec", n.name, str(c_client / "rdma-macvlan")],
            stdin=f,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )


def worker_pids(agent: Agent) -> list[int]:
    """Children of the agent process (the agent runs under ip netns exec, which execs it)."""
    return children_of(agent.proc.pid)


def wait_for(cond: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return bool(cond())


def test_reconcile_at_start_restores_the_host_after_a_simulated_reboot(n: Node) -> None:
    before = n.snapshot()
    pod = n.pod()
    conf = n.config()
    add = cold(n, "ADD", dict(conf, masters=["bond1"]), pod, "rebooted")
    assert add.code == 0, add.stdout
    assert n.snapshot() != before
    n.delete_pod(pod)  # the "reboot": the pod netns is gone and the runtime never calls DEL
    a = Agent(n, "--reconcile-interval", "0")  # reconcile once, at start
    try:
        assert wait_for(lambda: n.state_files() == [])
        assert n.snapshot() == before
    finally:
        a.stop()
    assert "gone; running DEL" in open(a.log).read()


def test_periodic_reconcile_restores_only_attachments_whose_netns_is_gone(n: Node, c_client: Path) -> None:
    before = n.snapshot()
    a = Agent(n, "--reconcile-interval", "0.3")
    try:
        alive, doomed = n.pod(), n.pod()
        assert warm(n, c_client, a.sock, "ADD", n.config(masters=["bond0"]), alive, "alive").code == 0
        assert warm(n, c_client, a.sock, "ADD", n.config(masters=["bond1"]), doomed, "doomed").code == 0
        n.delete_pod(doomed)
        assert wait_for(lambda: len([f for f in n.state_files() if f.endswith(".json")]) == 1)
        time.sleep(1.0)  # a few more passes: the live attachment must stay
        assert n.pins() == {"bond0": "alive"}
        assert n.ping(alive, "198.51.100.1", "bond0")
        assert '"local": "198.51.100.18"' in json.dumps(n.node_json("addr"))  # bond1 has its IP back
        assert warm(n, c_client, a.sock, "DEL", n.config(masters=["bond0"]), alive, "alive").code == 0
        assert n.snapshot() == before
    finally:
        a.stop()


def test_python_entry_point_forwards_to_the_agent_with_the_same_result(n: Node, agent: Agent) -> None:
    before = n.snapshot()
    conf = n.config(masters=["bond0"])
    pod_c, pod_w = n.pod(), n.pod()
    add_c = cold(n, "ADD", conf, pod_c, "py-cold")
    assert add_c.code == 0 and cold(n, "DEL", conf, pod_c, "py-cold").code == 0
    sock = {"RDMA_CNI_AGENT_SOCKET": agent.sock}
    add_w = n.plugin("ADD", conf, pod_w, container_id="py-warm", extra=sock)
    assert add_w.code == 0, add_w.stdout + add_w.stderr
    assert "served rdma-macvlan ADD py-warm/net1: exit 0" in open(agent.log).read()
    assert without_macs(add_w.out) == json.loads(
        json.dumps(without_macs(add_c.out)).replace(pod_c.name, pod_w.name)
    )
    assert n.ping(pod_w, "198.51.100.1", "bond0")
    assert n.plugin("DEL", conf, pod_w, container_id="py-warm", extra=sock).code == 0
    assert "served rdma-macvlan DEL py-warm/net1: exit 0" in open(agent.log).read()
    assert n.snapshot() == before
