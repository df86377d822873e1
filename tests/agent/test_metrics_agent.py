"""The agent's /metrics end to end: a real rdma-agent (C client, fallback disabled) on a simulated
RDMA node, scraped by a real Prometheus (Debian's package) started in the node netns with a static
scrape config; its query API must show a pod's bond lent, then back on the host, and the calls.

Also: the metrics process is replaced when killed (the CNI calls never notice), the workers do not
hold its port, and ``cni-tool doctor`` says where the endpoint is and whether it answers.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netns
import pytest
from simnode import sim_node

from rdma_cni.doctor import metrics_checks
from rdma_cni.doctor.findings import OK, SKIP, WARN
from rdma_cni.doctor.node import NodePaths, observe
from rdma_cni.net.netns import entered, open_netns
from rdma_cni.rdma import sysfs
from rdma_cni.sim.sync import wait_watched

pytestmark = pytest.mark.netns
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


@dataclass
class Agent:
    node: netns.Node
    root: str
    conf: dict[str, Any]
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


def in_node(n: netns.Node, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` with this thread in the node netns (its sockets are the node's)."""
    with open_netns(f"/run/netns/{n.name}") as ns, entered(ns):
        return fn()


def free_port(n: netns.Node) -> int:
    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    return int(in_node(n, pick))


def http_get(n: netns.Node, url: str, timeout: float = 5.0) -> tuple[int, str]:
    parts = urllib.parse.urlsplit(url)
    sock = in_node(n, lambda: socket.create_connection((parts.hostname, parts.port), timeout=timeout))
    conn = http.client.HTTPConnection(str(parts.hostname), parts.port, timeout=timeout)
    conn.sock = sock
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def sample(text: str, line_start: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def agent(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    """The agent on a simulated node; ``reconcile`` (indirect param) is its --reconcile-interval."""
    reason = netns.can_run()
    if reason:
        pytest.skip(reason)
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.skip("Debian's prometheus is not installed (scripts/setup installs it)")
    monkeypatch.setattr(netns, "PREFIX", "h13-")
    client = netns.c_client()  # built before the node exists: the agent's calls must not wait for gcc
    assert os.path.exists(client)
    with netns.node() as n:
        for i in range(2):
            n.bond(f"bond{i}", f"198.51.100.{16 * i + 2}/28", peer=f"198.51.100.{16 * i + 1}/28")
        root = os.path.join(n.tmp, "sys")
        with sim_node(root, ["bond0", "bond1"], n.name, f"h13-{n.tag}-pod-"):
            conf = n.config(sysfsRoot=root, rdma={"required": True, "gidTimeoutMs": 3000}, masters=["bond0"])
            conf_file = os.path.join(n.tmp, "rdma-net.conf")
            Path(conf_file).write_text(json.dumps(conf))
            port = free_port(n)
            proc = netns.launch_agent(
                n.agent_socket, os.path.join(n.tmp, "agent.log"), "--reconcile-interval",
                str(getattr(request, "param", -1)), "--conf",
                conf_file, "--metrics-address", f"127.0.0.1:{port}", netns=n.name,
                env=dict(os.environ, PYTHONPATH=netns.REPO),
            )
            n.mode = "agent"  # every call through the C client, answered by this agent or failing
            try:
                yield Agent(n, root, conf, proc, port)
            finally:
                netns.stop_agent(proc)


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@dataclass
class Prometheus:
    node: netns.Node
    port: int

    def query(self, expr: str) -> list[dict[str, Any]]:
        status, body = http_get(self.node, f"http://127.0.0.1:{self.port}/api/v1/query?"
                                + urllib.parse.urlencode({"query": expr}))
        assert status == 200, body
        data = json.loads(body)
        assert data["status"] == "success", data
        return list(data["data"]["result"])

    def values(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        out = {}
        for r in self.query(expr):
            labels = {k: v for k, v in r["metric"].items() if k not in ("instance", "job", "__name__")}
            out[tuple(sorted(labels.items()))] = float(r["value"][1])
        return out


@pytest.fixture
def prometheus(agent: Agent, tmp_path: Path) -> Iterator[Prometheus]:
    """Prometheus in the node netns: a static scrape of the agent every second, its own storage."""
    n = agent.node
    port = free_port(n)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
        "scrape_configs:\n  - job_name: rdma-agent\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{agent.port}']\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")  # closed below, after the process
    proc = subprocess.Popen(
        ["ip", "netns", "exec", n.name, PROMETHEUS, f"--config.file={config}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=log,
    )
    try:
        prom = Prometheus(n, port)

        def ready() -> bool:
            try:
                return http_get(n, f"http://127.0.0.1:{port}/-/ready", 2.0)[0] == 200
            except OSError:
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                return False

        wait_for("Prometheus ready", ready, 60)
        try:
            wait_for("the agent scraped", lambda: prom.values('up{job="rdma-agent"}') == {(): 1.0}, 30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {prom.query('up')}") from exc
        yield prom
    finally:
        proc.send_signal(signal.SIGKILL)  # by its pid (ip netns exec execs it: the same process)
        proc.wait(30)
        log.close()


def test_prometheus_sees_the_bond_lent_to_the_pod_then_back_on_the_host(
    agent: Agent, prometheus: Prometheus
) -> None:
    n, prom = agent.node, prometheus
    host_index = sysfs.roce_v2_index(agent.root, "mlx5_bond_0", 1, "198.51.100.2")
    assert host_index is not None
    # numa="" (the simulated devices have no numa_node): to Prometheus an empty label is no label.
    assert prom.values('rdma_cni_bond_info{numa=""}') == {
        (("bond", "bond0"), ("rdma_device", "mlx5_bond_0")): 1.0,
        (("bond", "bond1"), ("rdma_device", "mlx5_bond_1")): 1.0,
    }
    assert prom.values("rdma_cni_bond_holder") == {}
    assert prom.values("rdma_cni_bond_address_lost") == {(("bond", "bond0"),): 0.0, (("bond", "bond1"),): 0.0}
    assert prom.values("rdma_cni_gid_index_unified") == {(): 1.0}

    pod = n.pod()
    wait_watched(f"/run/netns/{n.name}", pod.path)
    res = n.plugin("ADD", agent.conf, pod, container_id="c-prom")
    assert res.code == 0, res.stdout + res.stderr
    lent = {(("bond", "bond0"), ("pod", "p"), ("pod_namespace", "default")): 1.0}
    wait_for("the holder series", lambda: prom.values("rdma_cni_bond_holder") == lent)
    assert prom.values("rdma_cni_bond_address_lost") == {(("bond", "bond0"),): 0.0, (("bond", "bond1"),): 0.0}
    assert prom.values('rdma_cni_gid_index{rdma_device="mlx5_bond_0"}') == {
        (("rdma_device", "mlx5_bond_0"),): float(host_index)  # in the pod, at the host's index
    }
    assert prom.values('rdma_cni_state_records{phase="added"}') == {(("phase", "added"),): 1.0}
    add = '{plugin="rdma-macvlan",verb="ADD"}'
    # The worker reports the call after answering it, so a scrape may see the pod before the count.
    wait_for("the ADD counted", lambda: prom.values(f'rdma_cni_cni_calls_total{add[:-1]},result="ok"}}') == {
        (("plugin", "rdma-macvlan"), ("result", "ok"), ("verb", "ADD")): 1.0
    })
    assert prom.values(f"rdma_cni_cni_call_duration_seconds_count{add}") == {
        (("plugin", "rdma-macvlan"), ("verb", "ADD")): 1.0
    }
    # The one ADD's duration lies under the 10 s bucket and, served warm, well under 1 s.
    assert prom.values(f'rdma_cni_cni_call_duration_seconds_bucket{add[:-1]},le="1.0"}}') == {
        (("le", "1.0"), ("plugin", "rdma-macvlan"), ("verb", "ADD")): 1.0
    }

    res = n.plugin("DEL", agent.conf, pod, container_id="c-prom")
    assert res.code == 0, res.stdout + res.stderr
    wait_for("the holder series gone", lambda: prom.values("rdma_cni_bond_holder") == {} and prom.values(
        'rdma_cni_state_records{phase="added"}') == {(("phase", "added"),): 0.0})
    assert prom.values("rdma_cni_bond_address_lost") == {(("bond", "bond0"),): 0.0, (("bond", "bond1"),): 0.0}
    assert prom.values('rdma_cni_gid_index{rdma_device="mlx5_bond_0"}') == {
        (("rdma_device", "mlx5_bond_0"),): float(host_index)  # back on the host, same index
    }
    wait_for("the DEL counted", lambda: prom.values(
        'rdma_cni_cni_calls_total{plugin="rdma-macvlan",verb="DEL",result="ok"}'))
    # A call that fails is counted with its CNI error code (from its answer; the exit code is 1).
    res = n.plugin("ADD", dict(agent.conf, masters=["bond9"]), n.pod(), container_id="c-bad")
    assert res.code != 0 and "code" in res.out, (res.code, res.stdout, res.stderr)
    code = str(res.out["code"])
    wait_for("the error counted", lambda: prom.values(
        f'rdma_cni_cni_call_errors_total{{plugin="rdma-macvlan",verb="ADD",code="{code}"}}'))
    # Reporting left nothing behind in the workers: each went back to waiting for the next call.
    log = Path(n.tmp, "agent.log").read_text()
    assert "exits after its call" not in log and "served rdma-macvlan DEL" in log


def port_holders(agent: Agent) -> list[int]:
    """The agent and its descendants holding the metrics listener (found by its socket inode)."""
    def listening_inodes() -> set[str]:
        out = set()
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[1].endswith(f":{agent.port:04X}") and fields[3] == "0A":  # LISTEN
                    out.add(fields[9])
        return out

    inodes = in_node(agent.node, listening_inodes)
    assert len(inodes) == 1
    holders = [pid for pid in [agent.proc.pid, *all_descendants(agent.proc.pid)]
               if any(f"socket:[{i}]" in fds_of(pid) for i in inodes)]
    return holders


def all_descendants(pid: int) -> list[int]:
    out = []
    for child in netns.children_of(pid):
        out += [child, *all_descendants(child)]
    return out


def fds_of(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
    except OSError:
        pass
    return out


def test_a_killed_metrics_process_is_replaced_and_workers_never_hold_its_port(agent: Agent) -> None:
    n = agent.node
    status, text = wait_for("metrics", lambda: _try_get(n, agent.url))
    assert status == 200 and "rdma_cni_bond_info" in text
    agent_pid = agent.proc.pid
    # `ip netns exec` execs the agent: the Popen pid is the agent's parent process itself.
    holders = port_holders(agent)
    assert agent_pid in holders and len(holders) == 2, holders  # the parent and the metrics process
    (child,) = [p for p in holders if p != agent_pid]
    workers = [p for p in netns.children_of(agent_pid) if p != child]
    assert workers, "the agent keeps idle workers"
    os.kill(child, signal.SIGKILL)
    pod = n.pod()
    wait_watched(f"/run/netns/{n.name}", pod.path)
    res = n.plugin("ADD", agent.conf, pod, container_id="c-kill")  # served meanwhile, by a worker
    assert res.code == 0, res.stdout + res.stderr

    def replaced() -> bool:
        got = _try_get(n, agent.url)
        return bool(got) and "rdma_cni_bond_holder{" in got[1]

    wait_for("a new metrics process", replaced)
    new_holders = port_holders(agent)
    assert child not in new_holders and len(new_holders) == 2
    # The events sent while no metrics process ran waited in the channel: the ADD is counted.
    text = _try_get(n, agent.url)[1]
    assert sample(text, 'rdma_cni_cni_calls_total{plugin="rdma-macvlan",result="ok",verb="ADD"}') == 1.0
    assert n.plugin("DEL", agent.conf, pod, container_id="c-kill").code == 0


def _try_get(n: netns.Node, url: str) -> tuple[int, str] | None:
    try:
        return http_get(n, url, 2.0)
    except OSError:
        return None


def test_doctor_says_where_the_metrics_are_and_whether_they_answer(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    n = agent.node
    paths = NodePaths(sysfs_root=agent.root, netns=f"/run/netns/{n.name}", data_dir=n.data_dir,
                      run_dir=str(tmp_path / "elsewhere"), conf_dir=str(tmp_path))
    monkeypatch.setenv("RDMA_CNI_AGENT_SOCKET", n.agent_socket)
    (finding,) = metrics_checks.check_metrics(observe(paths))
    assert finding.status == OK and agent.url in finding.detail and "series" in finding.detail, finding
    netns.stop_agent(agent.proc)
    (finding,) = metrics_checks.check_metrics(observe(paths))
    assert finding.status == WARN and "does not answer" in finding.detail and agent.url in finding.detail
    monkeypatch.setenv("RDMA_CNI_AGENT_SOCKET", str(tmp_path / "none" / "agent.sock"))
    (finding,) = metrics_checks.check_metrics(observe(paths))
    assert finding.status == SKIP and "--metrics-address" in finding.detail


@pytest.mark.parametrize("agent", [1], indirect=True)
def test_reconcile_repairs_are_counted_and_the_bond_comes_back(agent: Agent) -> None:
    """A pod netns deleted without DEL: reconcile (every second here, in a forked job) gives the
    bond's address back and reports the pass and its repair to the metrics process."""
    n = agent.node
    pod = n.pod()
    wait_watched(f"/run/netns/{n.name}", pod.path)
    res = n.plugin("ADD", agent.conf, pod, container_id="c-rec")
    assert res.code == 0, res.stdout + res.stderr
    n.delete_pod(pod)  # the runtime never sends DEL
    text = wait_for("a reconcile repair", lambda: (got := _try_get(n, agent.url)) and sample(
        got[1], "rdma_cni_reconcile_repairs_total") == 1.0 and got[1], 60)
    assert (sample(text, "rdma_cni_reconcile_runs_total") or 0) >= 1
    assert sample(text, "rdma_cni_reconcile_failures_total") == 0.0
    wait_for("bond0 back on the host", lambda: (got := _try_get(n, agent.url)) and sample(
        got[1], 'rdma_cni_bond_address_lost{bond="bond0"}') == 0.0 and "rdma_cni_bond_holder{" not in got[1])
