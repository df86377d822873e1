"""RDMA_CNI_AGENT_TIMEOUT: how long a plugin's thin client waits for the agent's READY before it runs
the call itself. Both clients (C, the bundle's default front; Python, the entry points' first step)
read it. The "agent" here is a socket that accepts connections into its backlog and never answers:
a wedged agent as a client sees it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import build_c_client

REPO = Path(__file__).resolve().parents[2]
VERSION_STDIN = b'{"cniVersion":"1.0.0"}'


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("h10-c-client")
    build_c_client(str(out))
    (out / "rdma-macvlan").symlink_to("rdma-cni-client")
    fallback = out / "fallback.sh"
    fallback.write_text('#!/bin/sh\nprintf "fell back agent=%s" "$RDMA_CNI_AGENT"\n')
    fallback.chmod(0o755)
    return out


@pytest.fixture
def silent_agent(tmp_path: Path) -> Iterator[Path]:
    """A listening socket nobody accepts on: connect and send succeed, READY never comes."""
    path = tmp_path / "wedged.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(16)
        yield path
    finally:
        sock.close()


def _c_env(c_client: Path, sock: Path, timeout: str | None) -> dict[str, str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "CNI_COMMAND": "VERSION",
        "RDMA_CNI_AGENT_SOCKET": str(sock),
        "RDMA_CNI_FALLBACK": str(c_client / "fallback.sh"),
    }
    if timeout is not None:
        env["RDMA_CNI_AGENT_TIMEOUT"] = timeout
    return env


@pytest.mark.parametrize("timeout", ["0.2", "0", "-1", "0.001"])
def test_c_client_gives_up_on_a_silent_agent_after_the_timeout_and_falls_back(
    c_client: Path, silent_agent: Path, timeout: str
) -> None:
    proc = subprocess.run(
        [str(c_client / "rdma-macvlan")],
        input=VERSION_STDIN,
        env=_c_env(c_client, silent_agent, timeout),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.stdout == b"fell back agent=off", proc.stderr


def test_c_client_waits_as_long_as_the_timeout_says(c_client: Path, silent_agent: Path) -> None:
    """600 s: still waiting for READY long after the 3 s default would have fallen back."""
    proc = subprocess.Popen(
        [str(c_client / "rdma-macvlan")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=_c_env(c_client, silent_agent, "600"),
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(VERSION_STDIN, timeout=6)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("timeout", ["soon", "", "1e999x"])
def test_c_client_ignores_an_unparsable_timeout(c_client: Path, silent_agent: Path, timeout: str) -> None:
    """The 3 s default applies: the call still falls back and completes."""
    proc = subprocess.run(
        [str(c_client / "rdma-macvlan")],
        input=VERSION_STDIN,
        env=_c_env(c_client, silent_agent, timeout),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.stdout == b"fell back agent=off", proc.stderr


def test_python_client_reads_the_same_timeout(silent_agent: Path) -> None:
    """try_agent gives up on the silent agent (None: run in-process) within the given timeout."""
    code = (
        "import sys\n"
        "from rdma_cni.agent.client import try_agent\n"
        "print('in-process' if try_agent('rdma-macvlan') is None else 'agent')\n"
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO),
        "CNI_COMMAND": "VERSION",
        "RDMA_CNI_AGENT_SOCKET": str(silent_agent),
        "RDMA_CNI_AGENT_TIMEOUT": "600",
    }
    waiting = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.communicate(VERSION_STDIN, timeout=6)
    finally:
        waiting.kill()
        waiting.wait()
    quick = subprocess.run(
        [sys.executable, "-c", code],
        input=VERSION_STDIN,
        env={**env, "RDMA_CNI_AGENT_TIMEOUT": "0.2"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert quick.stdout == b"in-process\n", quick.stderr
