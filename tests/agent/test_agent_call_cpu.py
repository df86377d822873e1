"""What a CNI call costs in CPU, by part, as the agent's workers account it: our plugin code, the
programs the call ran (its delegates, reaped children of the worker), and its Kubernetes API
requests. TKE's pod through rdma-multus on a real agent and a real API server (TLS): all three parts
are there, they add up to the worker's CPU, and the metrics process counts them per part."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rdma_cni.agent.metrics import events as metrics_events
from rdma_cni.agent.metrics.server import CallMetrics
from tests.agent.test_agent_multus import H7Node, agent, api, node, pki, run  # noqa: F401 - fixtures
from tests.kube_server import KubeServer
from tests.multus_node import ANNOTATION, RESOURCE

pytestmark = pytest.mark.netns

SERVED = re.compile(
    r"served (?P<plugin>[\w-]+) (?P<verb>\w+) c1/(?P<ifname>\w+): exit 0 in [\d.]+ ms "
    r"\(cpu (?P<total>[\d.]+) ms: "
    r"plugin (?P<own>[\d.]+), delegates (?P<delegates>[\d.]+), API (?P<api>[\d.]+);"
)


def test_an_add_and_del_through_rdma_multus_account_plugin_delegates_and_api_cpu(
    node: H7Node, api: KubeServer, agent: tuple[str, Path, int], tmp_path: Path  # noqa: F811
) -> None:
    sock, log, _ = agent
    uid = str(uuid.uuid4())
    api.add_pod("default", "ibv-app-0", uid=uid, annotations={ANNOTATION: "tke-route-eni,tke-rdma-macvlan"},
                limits={RESOURCE: "2"})  # fmt: skip
    node.checkpoint(uid, ["0", "1"])
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    pod = node.pod_netns()
    assert run(node, sock, "ADD", conf, pod, uid)[0] == 0
    assert run(node, sock, "DEL", conf, pod, uid)[0] == 0
    served = {(m["plugin"], m["verb"], m["ifname"]): m for m in SERVED.finditer(log.read_text())}
    add = served[("rdma-multus", "ADD", "eth0")]
    # rdma-multus read the pod over TLS, ran its delegates (the thin client of rdma-macvlan: a child
    # of the worker) and did work of its own
    assert float(add["api"]) > 0 and float(add["delegates"]) > 0 and float(add["own"]) > 0, add.group(0)
    parts = float(add["own"]) + float(add["delegates"]) + float(add["api"])
    assert abs(parts - float(add["total"])) < 0.2, add.group(0)
    # the delegate's own call ran in another worker, with no API request and no child of its own
    delegate = served[("rdma-macvlan", "ADD", "net1")]
    assert float(delegate["api"]) == 0 and float(delegate["own"]) > 0, delegate.group(0)


def test_the_metrics_process_counts_each_part_and_reads_events_without_them() -> None:
    rx = metrics_events.open_channel()
    try:
        metrics_events.report_call("rdma-multus", "ADD", 0, 0.2, metrics_events.CallCpu(0.03, 0.05, 0.01))
        metrics_events.report_call("rdma-multus", "ADD", 0, 0.1, metrics_events.CallCpu(0.02, 0.04, 0.0))
        metrics_events.report_call("rdma-macvlan", "DEL", 0, 0.03)  # an event without CPU parts
        rx.setblocking(False)
        registry = CollectorRegistry(auto_describe=False)
        calls = CallMetrics(registry)
        for _ in range(3):
            calls.apply(metrics_events.decode(rx.recv(metrics_events.MAX_EVENT)))
    finally:
        metrics_events.close_channel()
        rx.close()

    def cpu(plugin: str, verb: str, part: str) -> float | None:
        labels = {"plugin": plugin, "verb": verb, "part": part}
        return registry.get_sample_value("rdma_cni_cni_call_cpu_seconds_total", labels)

    assert cpu("rdma-multus", "ADD", "plugin") == pytest.approx(0.05)
    assert cpu("rdma-multus", "ADD", "delegates") == pytest.approx(0.09)
    assert cpu("rdma-multus", "ADD", "kube_api") == pytest.approx(0.01)
    assert cpu("rdma-macvlan", "DEL", "plugin") is None
    assert registry.get_sample_value(
        "rdma_cni_cni_calls_total", {"plugin": "rdma-macvlan", "verb": "DEL", "result": "ok"}
    ) == 1
    # a malformed part list is a malformed event, not a crash
    assert metrics_events.decode(b'{"e":"call","plugin":"p","verb":"ADD","code":0,"s":1,"cpu":[1]}') is None
