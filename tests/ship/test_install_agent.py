"""The thin client in front of the installed plugins: rdma-agent warm, the bundle cold
(``tests/install_support.py``). VERSION with and without the installed agent and after it was
killed, ADD/CHECK/DEL in a node netns served by either, and the frozen agent's /metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_support
import pytest
from install_support import PLUGINS, PREFIX, REPO, ask_version, bare_env, installed, need, no_python_path, run
from netns import policy_env

# scripts/build's bundle, built once per run (tests/install_support.py).
bundle = install_support.bundle


def _wait_for(predicate: Any, what: str, agent: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert agent.poll() is None, f"rdma-agent exited with {agent.returncode} before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def _running_agent(bin_dir: Path, tmp_path: Path) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes]]]:
    """The installed bundle's rdma-agent, as the DaemonSet runs it (reconcile off: it must not touch
    anything here); yields (socket, log file, process), killed by pid at the end."""
    if os.geteuid() != 0:
        pytest.skip("rdma-agent serves root only (its socket is chowned to root)")
    sock = tmp_path / "run" / "agent.sock"
    log = tmp_path / "agent.log"
    argv = [str(bin_dir / "rdma-cni.d/current/rdma-cni"), "rdma-agent", "--socket", str(sock)]
    argv += ["--reconcile-interval", "-1", "--conf-dir", str(tmp_path / "no-confs"), "--log-file", str(log)]
    agent = subprocess.Popen(
        argv, env=bare_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for(sock.exists, "its socket", agent)
        yield sock, log, agent
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=30)


def test_installed_plugins_answer_version_through_the_client_with_and_without_an_agent(
    bundle: Path, tmp_path: Path
) -> None:
    """The installed rdma-macvlan / rdma-multus (the C client): no agent -> the bundle answers; the
    installed rdma-agent running -> it answers, with fallback made impossible; agent killed -9
    (its socket file left behind) -> the bundle answers again. The same bytes every time."""
    root = tmp_path / "root"
    bin_dir = installed(bundle, root)
    sock = tmp_path / "run" / "agent.sock"
    env = bare_env(tmp_path, CNI_COMMAND="VERSION", RDMA_CNI_AGENT_SOCKET=str(sock))

    cold = {name: ask_version(bin_dir, name, env) for name in PLUGINS}
    for name, proc in cold.items():
        assert proc.returncode == 0, (name, proc.stderr)
        assert {"0.3.1", "1.0.0", "1.1.0"} <= set(json.loads(proc.stdout)["supportedVersions"]), name

    agent_argv = [str(bin_dir / "rdma-cni.d/current/rdma-cni"), "rdma-agent"]
    with _running_agent(bin_dir, tmp_path) as (sock, log, agent):
        assert sock.stat().st_mode & 0o777 == 0o600
        probe = run([*agent_argv, "--probe", "--socket", str(sock)], env=bare_env(tmp_path))
        assert probe.returncode == 0, probe.stderr
        # A fallback would exec /bin/false and fail: an answer here came from the agent.
        warm_env = {**env, "RDMA_CNI_FALLBACK": "/bin/false"}
        for name in PLUGINS:
            warm = ask_version(bin_dir, name, warm_env)
            assert (warm.returncode, warm.stdout) == (0, cold[name].stdout), (name, warm.stderr)
        _wait_for(
            lambda: all(f"served {n} VERSION" in log.read_text() for n in PLUGINS), "the served log", agent
        )
        agent.kill()
        agent.wait(timeout=30)
        assert sock.exists()  # stale: connect() is refused, and the client must fall back
        assert ask_version(bin_dir, "rdma-macvlan", warm_env).returncode != 0  # proves it fell back
        for name in PLUGINS:
            again = ask_version(bin_dir, name, env)
            assert (again.returncode, again.stdout) == (0, cold[name].stdout), (name, again.stderr)
        probe = run([*agent_argv, "--probe", "--socket", str(sock)], env=bare_env(tmp_path))
        assert probe.returncode == 1 and "no agent answered" in probe.stderr


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """H2's node/switch netns pair (tests/netns.py), named with this file's prefix."""
    import netns

    reason = netns.can_run()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(netns, "PREFIX", PREFIX)
    with netns.node() as n:
        yield n


def _plugin(
    bin_dir: Path,
    n: Any,
    command: str,
    conf: dict[str, Any],
    pod: Any,
    path: str,
    extra_env: dict[str, str] | None = None,
) -> Any:
    """The installed rdma-macvlan run in the node netns like a runtime would, with no Python on PATH."""
    import netns

    env = {
        "PATH": path,
        "CNI_COMMAND": command, **policy_env(),
        "CNI_CONTAINERID": "ship1",
        "CNI_NETNS": pod.path if pod else "",
        "CNI_IFNAME": "net1",
        "CNI_PATH": str(bin_dir),
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p",
        "RDMA_CNI_AGENT_SOCKET": str(Path(path) / "no-agent.sock"),
        **(extra_env or {}),
    }
    ip = shutil.which("ip")
    assert ip is not None
    proc = subprocess.run(
        [ip, "netns", "exec", n.name, str(bin_dir / "rdma-macvlan")],
        input=json.dumps(conf).encode(),
        capture_output=True,
        timeout=120,
        env=env,
        check=False,
    )
    return netns._result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


@pytest.mark.parametrize("served_by", ["bundle", "agent"])
def test_add_check_del_through_the_installed_bundle_without_python(
    bundle: Path, node: Any, tmp_path: Path, served_by: str
) -> None:
    """ADD/CHECK/DEL of the installed rdma-macvlan (the C client): with no agent the bundle runs them;
    with the installed rdma-agent running, the agent does, and a fallback would fail the call."""
    need("macvlan")
    bin_dir = installed(bundle, tmp_path / "root")
    path = no_python_path(tmp_path)
    with contextlib.ExitStack() as stack:
        extra: dict[str, str] = {}
        if served_by == "agent":
            sock, log, agent = stack.enter_context(_running_agent(bin_dir, tmp_path))
            extra = {"RDMA_CNI_AGENT_SOCKET": str(sock), "RDMA_CNI_FALLBACK": "/bin/false"}
        _add_check_del(bin_dir, node, path, extra)
        if served_by == "agent":
            # The worker logs after it has answered: wait for the line, it cannot be missing for good.
            _wait_for(
                lambda: all(
                    f"served rdma-macvlan {verb} ship1/net1: exit 0" in log.read_text()
                    for verb in ("ADD", "CHECK", "DEL")
                ),
                "ADD, CHECK and DEL in the agent's log",
                agent,
            )


def _add_check_del(bin_dir: Path, node: Any, path: str, extra: dict[str, str]) -> None:
    node.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
    node.bond("bond1", "198.51.100.18/28", peer="198.51.100.17/28")
    before = node.snapshot()
    pod = node.pod()
    conf = json.loads((REPO / "conf/vpc-cni/rdma-multus.d/tke-rdma-macvlan.conf").read_text())
    conf.update(node.config(masters=["bond0", "bond1"], count=2))
    add = _plugin(bin_dir, node, "ADD", conf, pod, path, extra)
    assert add.code == 0, add.stdout + add.stderr
    assert sorted(i["name"] for i in add.out["interfaces"]) == ["bond0", "bond1"]
    assert {
        a["ifname"]: [x["local"] for x in a["addr_info"] if x["family"] == "inet"]
        for a in node.pod_json(pod, "addr")
        if a["ifname"] != "lo"
    } == {"bond0": ["198.51.100.2"], "bond1": ["198.51.100.18"]}
    assert node.ping(pod, "198.51.100.1", "bond0") and node.ping(pod, "198.51.100.17", "bond1")
    check = _plugin(bin_dir, node, "CHECK", {**conf, "prevResult": add.out}, pod, path, extra)
    assert check.code == 0, check.stdout + check.stderr
    delete = _plugin(bin_dir, node, "DEL", {**conf, "prevResult": add.out}, pod, path, extra)
    assert delete.code == 0, delete.stdout + delete.stderr
    assert node.snapshot() == before


def test_installed_agent_serves_metrics_from_the_frozen_bundle(bundle: Path, tmp_path: Path) -> None:
    """The frozen rdma-agent carries prometheus_client and the collector: --metrics-address answers
    /metrics with every section read (in a netns of its own: a loopback port, nothing else)."""
    if os.geteuid() != 0:
        pytest.skip("rdma-agent serves root only; the netns needs root")
    bin_dir = installed(bundle, tmp_path / "root")
    ns = f"h13-bundle-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    agent = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        sock = tmp_path / "run" / "agent.sock"
        argv = ["ip", "netns", "exec", ns, str(bin_dir / "rdma-cni.d/current/rdma-cni"), "rdma-agent",
                "--socket", str(sock), "--reconcile-interval", "-1", "--conf-dir", str(tmp_path / "none"),
                "--metrics-address", "127.0.0.1:9513"]
        agent = subprocess.Popen(argv, env=bare_env(tmp_path), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        # the agent notes its endpoint once it holds the socket (a second agent that fails to bind must
        # not overwrite the first one's note): wait for the note, not the socket
        note_path = tmp_path / "run" / "agent-metrics.json"
        _wait_for(note_path.exists, "its metrics note beside the socket", agent)
        assert sock.exists()
        note = json.loads(note_path.read_text())
        assert note["url"] == "http://127.0.0.1:9513/metrics"
        fetch = [str(bin_dir / "rdma-cni.d/current/rdma-cni"), "cni-tool", "doctor", "--json",
                 "--netns", f"/run/netns/{ns}", "--run-dir", str(tmp_path / "run")]

        def answered() -> bool:
            out = run(fetch, env=bare_env(tmp_path, RDMA_CNI_AGENT_SOCKET=str(sock))).stdout
            found = [f for f in json.loads(out or "{}").get("findings", []) if f["check"] == "metrics"]
            return bool(found) and found[0]["status"] == "OK"

        _wait_for(answered, "cni-tool doctor to see /metrics answer", agent, timeout=60)
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait(timeout=30)
        subprocess.run(["ip", "netns", "del", ns], check=False)
