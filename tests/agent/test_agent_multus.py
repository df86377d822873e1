"""The seed's pod through the warm path: rdma-multus and its rdma-macvlan delegate both served by
rdma-agent (the delegate's executable is the C thin client too, so the agent's multus worker execs a
client that comes back to the agent). Fallbacks are disabled: every call must be answered by the
agent, and its log says it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import policy_env

from tests.kube_server import KubeServer, Pki
from tests.multus_node import ANNOTATION, RESOURCE, Node, addrs, links
from tests.netns import build_c_client, launch_agent, stop_agent
from tests.podresources_server import PodResourcesServer

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
HOST = {"bond0": ["203.0.113.2/24"], "bond1": ["198.51.100.130/28"]}


class H7Node(Node):
    """H5's node with this helper's namespace names."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = f"h7-node-{self.tag}"
        self.switch = f"h7-sw-{self.tag}"

    def pod_netns(self) -> str:
        name = f"h7-pod-{self.tag}-{len(self.pods)}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        self.pods.append(name)
        return name


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("h7-pki"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[H7Node]:
    n = H7Node(tag=f"{os.getpid()}-{uuid.uuid4().hex[:6]}", root=tmp_path)
    try:
        n.up()
        n.add_bond("bond1", "198.51.100.130/28", "198.51.100.129/28")
        build_c_client(str(n.bin_dir))
        for name in ("rdma-macvlan", "rdma-multus"):
            (n.bin_dir / name).symlink_to("rdma-cni-client")
        n.rdma_macvlan_network(tmp_path)
        yield n
    finally:
        n.down()


@pytest.fixture
def api(node: H7Node, pki: Pki) -> Iterator[KubeServer]:
    with KubeServer(pki, netns=node.name) as server:
        yield server


@pytest.fixture
def agent(node: H7Node) -> Iterator[tuple[str, Path, int]]:
    sock = str(node.root / "agent.sock")
    log = node.root / "agent.log"
    proc = launch_agent(sock, str(log), "--reconcile-interval", "-1", netns=node.name)
    try:
        yield sock, log, proc.pid  # `ip netns exec` execs: the pid is the agent's own
    finally:
        stop_agent(proc)


def run(node: H7Node, sock: str, command: str, conf: dict[str, Any], netns: str, uid: str) -> tuple[int, Any]:
    env = {
        "PATH": os.environ["PATH"],
        "CNI_COMMAND": command, **policy_env(),
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": f"/var/run/netns/{netns}",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=ibv-app-0;K8S_POD_UID={uid}",
        "CNI_PATH": str(node.bin_dir),
        "RDMA_CNI_AGENT_SOCKET": sock,
        "RDMA_CNI_FALLBACK": "/bin/false",
    }
    proc = subprocess.run(
        ["ip", "netns", "exec", node.name, str(node.bin_dir / "rdma-multus")],
        input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr


def test_seed_pod_through_the_agent_multus_and_its_rdma_macvlan_delegate(
    node: H7Node, api: KubeServer, agent: tuple[str, Path, int], tmp_path: Path
) -> None:
    sock, log, _ = agent
    uid = str(uuid.uuid4())
    api.add_pod("default", "ibv-app-0", uid=uid, annotations={ANNOTATION: "tke-route-eni,tke-rdma-macvlan"},
                limits={RESOURCE: "2"})  # fmt: skip
    node.checkpoint(uid, ["0", "1"])
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    pod = node.pod_netns()

    code, result = run(node, sock, "ADD", conf, pod, uid)
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "bond0", "bond1"}
    assert addrs(pod, "bond0") == HOST["bond0"] and addrs(pod, "bond1") == HOST["bond1"]
    served = log.read_text()
    assert "served rdma-multus ADD c1/eth0: exit 0" in served
    assert "served rdma-macvlan ADD c1/net1: exit 0" in served  # the delegate, via the agent too

    code, out = run(node, sock, "CHECK", {**conf, "prevResult": result}, pod, uid)
    assert code == 0, out
    code, out = run(node, sock, "DEL", conf, pod, uid)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert {b: addrs(node.name, b) for b in HOST} == HOST
    assert "served rdma-macvlan DEL c1/net1: exit 0" in log.read_text()


def test_pod_resources_asked_from_a_worker_and_grpc_never_in_the_agent(
    node: H7Node, api: KubeServer, agent: tuple[str, Path, int], tmp_path: Path
) -> None:
    """gRPC and fork do not mix: the agent forks workers, so only a worker may load grpc (for the
    PodResources call of its ADD); the agent itself must never map it."""
    sock, log, agent_pid = agent
    uid = str(uuid.uuid4())
    api.add_pod("default", "ibv-app-0", uid=uid, annotations={ANNOTATION: "tke-route-eni,tke-rdma-macvlan"},
                limits={RESOURCE: "2"})  # fmt: skip
    node.checkpoint(uid, ["0"])  # one device: PodResources (two) must be what is used
    short = tempfile.mkdtemp(prefix="h7-pr-")
    try:
        with PodResourcesServer(os.path.join(short, "kubelet.sock")) as kubelet:
            kubelet.set_pod("default", "ibv-app-0", {"trainer": {RESOURCE: ["0", "1"]}})
            conf = node.config(api.kubeconfig(tmp_path / "kc"), podResourcesDir=short)
            pod = node.pod_netns()
            code, result = run(node, sock, "ADD", conf, pod, uid)
            assert code == 0, result
            assert kubelet.calls == ["Get"]
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert links(pod) == {"lo", "eth0", "bond0", "bond1"}
    (served,) = [line for line in log.read_text().splitlines() if "served rdma-multus ADD" in line]
    assert "exit 0" in served and "modules the agent did not warm" in served, served  # grpc: the worker's
    with open(f"/proc/{agent_pid}/maps") as f:
        assert "cygrpc" not in f.read()
    code, out = run(node, sock, "DEL", conf, pod, uid)
    assert code == 0, out
    assert {b: addrs(node.name, b) for b in HOST} == HOST
