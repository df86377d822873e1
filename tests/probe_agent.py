"""An rdma-agent serving the probe plugin of ``test_agent_probe``, and the calls the agent tests make.

The probe reports where it ran (namespaces, pid, environment) into a file the call names, and can
hold, sleep, fail or leak on request; these helpers start an agent on a socket of the test's own,
build the probe's CNI call and read what the probe wrote. Used by ``test_agent.py``,
``test_agent_pool.py``, ``test_agent_c_client.py`` and ``test_agent_prefault.py`` (the ``agent``
and ``netns`` fixtures are taken by assignment: ``agent = probe_agent.agent``).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from netns import children_of, launch_agent, policy_env
from netns import stop_agent as stop

from rdma_cni.agent import client
from rdma_cni.cni import dispatch
from tests.agent.test_agent_probe import SPEC as PROBE

TESTS = Path(__file__).resolve().parent
PROBE_DIR = TESTS / "agent"  # where test_agent_probe lives: the agent imports it by that name
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
        opts += ["--prefork", "2"]  # the pool tests (test_agent_pool.py) count on two idle workers
    if plugins:
        opts += ["--plugin", "probe=test_agent_probe:SPEC"]
    path = f"{PROBE_DIR}:{TESTS}:{os.environ.get('PYTHONPATH', '')}"
    env = dict(os.environ, PYTHONPATH=path, **(agent_env or {}))
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
        "CNI_COMMAND": command, **policy_env(),
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


def live_children(pid: int) -> set[int]:
    return {child for child in children_of(pid) if not is_zombie(child)}


def wait_for_children(pid: int, count: int, timeout: float = 20.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while len(found := live_children(pid)) != count:
        assert time.monotonic() < deadline, f"agent has {len(found)} live workers, expected {count}"
        time.sleep(0.02)
    return found
