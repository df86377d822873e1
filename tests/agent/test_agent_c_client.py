"""rdma-agent's C client (``rdma-cni-client``, the plugins' name on a node) against a real agent
served the probe plugin of ``test_agent_probe`` (``tests/probe_agent.py``): the same answers as
in-process, the caller's environment, the fallback with stdin intact, a worker killed mid-ADD, and
the fallback to the bundle program by the client's own name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import probe_agent
import pytest
from netns import build_c_client
from probe_agent import RunningAgent, cni_env, in_process, probe_conf, read_json

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]

# The agent on a socket of the test's own (tests/probe_agent.py).
agent = probe_agent.agent


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
    proc = start_c(c_client, env, probe_conf("0.4.0", sleep=5, startedFile=str(started)))
    os.kill(int(str(read_json(started)["pid"])), signal.SIGKILL)
    assert proc.stdout is not None
    out = proc.stdout.read()
    assert proc.wait(timeout=30) == 1
    err = json.loads(out)
    assert (err["code"], err["cniVersion"]) == (11, "0.4.0")


def test_c_client_agent_and_workers_killed_mid_add_runs_the_add_in_process(
    agent: RunningAgent, c_client: Path, tmp_path: Path
) -> None:
    started = tmp_path / "started.json"
    env = dict(
        cni_env("ADD"), RDMA_CNI_AGENT_SOCKET=agent.sock, RDMA_CNI_FALLBACK=str(c_client / "fallback.sh")
    )
    stdin = probe_conf("0.4.0", sleep=5, startedFile=str(started))
    proc = start_c(c_client, env, stdin)
    worker = int(str(read_json(started)["pid"]))
    for pid in (agent.pid, worker):  # the runtime kills the container's processes together
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.wait(timeout=30) == 42, out + err
    assert out.decode() == f"fallback agent=off argv0={c_client / 'fallback.sh'} stdin=" + stdin.decode()
    assert b"died during ADD, its workers with it" in err


def start_c(c_client: Path, env: dict[str, str], stdin: bytes) -> subprocess.Popen[bytes]:
    """The C client called as rdma-cni's probe plugin, its stdin written and closed, not waited for."""
    proc = subprocess.Popen([str(c_client / "probe")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(stdin)
    proc.stdin.close()
    return proc


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
