"""rdma-multus's DEL and the pod's ``k8s.v1.cni.cncf.io/network-status``, on the netns node
(``tests/multus_node.py``): DEL sets it to ``[]`` after the delegates' DEL, on that very pod (its UID
rides in the PATCH); an API server refusing connections, blackholed or too slow costs the DEL one
short attempt, a warning naming the pod, the annotation and the cause, and a count, never the bond;
a pod gone or replaced by a new one of the same name is left alone quietly; without a kubeconfig or
without the pod's netns nothing is asked.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import multus_node
from tests.kube_server import KubeServer
from tests.multus_node import ANNOTATION, CLEAN_NODE, Node, links, sh

pytestmark = pytest.mark.netns

pki = multus_node.pki
node = multus_node.node
api = multus_node.api

STATUS = "k8s.v1.cni.cncf.io/network-status"
POD = "default/ibv-app-0"
BLACKHOLE = "198.51.100.250"  # routed into the switch netns, which forwards nothing: SYNs vanish


def _added(node: Node, api: KubeServer, tmp: Path, **extra: Any) -> tuple[dict[str, Any], str, str]:
    """Pod ibv-app-0 (its own UID) with eth0 and the RDMA network net1 on bond0, added with its
    network-status written: (the config, the pod netns, the UID)."""
    uid = str(uuid.uuid4())
    api.add_pod("default", "ibv-app-0", uid=uid, annotations={ANNOTATION: "tke-rdma-macvlan"})
    conf = node.config(api.kubeconfig(tmp / "kc"), **extra)
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c1", pod, uid=uid)
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "net1"}
    written = json.loads(_annotations(api)[STATUS])
    assert [e["interface"] for e in written] == ["eth0", "net1"]
    return conf, pod, uid


def _annotations(api: KubeServer, name: str = "ibv-app-0") -> dict[str, str]:
    return dict(api.pods[("default", name)]["metadata"]["annotations"])


def _patches(api: KubeServer) -> list[dict[str, Any]]:
    return [json.loads(r["body"]) for r in api.requests if r["method"] == "PATCH"]


def _log_since(node: Node, offset: int) -> list[str]:
    return (node.root / "multus.log").read_text()[offset:].splitlines()


def _log_size(node: Node) -> int:
    return len((node.root / "multus.log").read_text())


def _loud(lines: list[str]) -> list[str]:
    """The lines logged at WARNING or ERROR (the log's format: date time pid LEVEL logger: msg)."""
    return [line for line in lines if re.match(r"\S+ \S+ \d+ (WARNING|ERROR) ", line)]


def _stats(node: Node) -> dict[str, Any]:
    path = node.cache_dir / "stats" / "network-status.json"
    return json.loads(path.read_text()) if path.exists() else {"failures": 0}


def test_del_sets_network_status_to_an_empty_list_on_that_pod(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, uid = _added(node, api, tmp_path)
    api.requests.clear()
    code, out = node.run("DEL", conf, "c1", pod, uid=uid)
    assert code == 0, out
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    assert _annotations(api)[STATUS] == "[]"
    assert _annotations(api)[ANNOTATION] == "tke-rdma-macvlan"  # a merge patch of our key only
    (patch,) = _patches(api)
    assert patch == {"metadata": {"uid": uid, "annotations": {STATUS: "[]"}}}
    assert _stats(node)["failures"] == 0
    code, out = node.run("DEL", conf, "c1", pod, uid=uid)  # a repeated DEL has no plan: asks nothing
    assert code == 0, out
    assert len(_patches(api)) == 1


@pytest.mark.parametrize("outage", ["refused", "blackholed"])
def test_api_server_down_del_gives_the_bond_back_warns_once_and_counts(
    node: Node, api: KubeServer, tmp_path: Path, outage: str
) -> None:
    # ADD's own budget is long (20 s, 3 attempts): DEL must not use it.
    conf, pod, uid = _added(node, api, tmp_path, apiTimeoutSeconds=20, apiAttempts=3)
    api.stop()
    if outage == "blackholed":
        sh("ip", "-n", node.name, "route", "add", f"{BLACKHOLE}/32", "via", "203.0.113.1")
        kc = Path(conf["kubeconfig"])
        kc.write_text(re.sub(r"server: \S+", f"server: https://{BLACKHOLE}:6443", kc.read_text()))
    offset = _log_size(node)
    started = time.monotonic()
    code, out = node.run("DEL", conf, "c1", pod, uid=uid)
    took = time.monotonic() - started
    assert code == 0, out
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE  # the bond is back on the host
    assert took < 8, f"DEL took {took:.1f}s"  # one attempt of 0.5 s, not ADD's 3 of 20 s
    (line,) = _loud(_log_since(node, offset))
    cause = "ConnectionRefusedError" if outage == "refused" else "TimeoutError"
    assert f"pod {POD}: {STATUS} not cleared: " in line and cause in line, line
    assert "1 attempt within 0.5s" in line
    stats = _stats(node)
    assert stats["failures"] == 1 and stats["lastPod"] == POD and cause in stats["lastError"]


def test_the_delegates_del_is_done_before_the_api_is_asked_and_a_slow_api_is_cut_short(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, uid = _added(node, api, tmp_path)
    api.requests.clear()
    api.delay = 3.0  # the API server answers, but too late for a DEL
    done: list[tuple[int, Any]] = []
    worker = threading.Thread(target=lambda: done.append(node.run("DEL", conf, "c1", pod, uid=uid)))
    worker.start()
    try:
        for _ in range(200):
            if _patches(api):
                break
            time.sleep(0.05)
        assert _patches(api), "DEL never asked the API server"
        assert links(pod) == {"lo"}  # net1 and eth0 were gone when the PATCH arrived
    finally:
        worker.join(timeout=60)
    ((code, out),) = done
    assert code == 0, out
    assert node.leftovers() == CLEAN_NODE
    assert "TimeoutError" in _stats(node)["lastError"]


def test_a_pod_gone_is_left_quietly(node: Node, api: KubeServer, tmp_path: Path) -> None:
    conf, pod, uid = _added(node, api, tmp_path, logLevel="debug")
    del api.pods[("default", "ibv-app-0")]
    offset = _log_size(node)
    code, out = node.run("DEL", conf, "c1", pod, uid=uid)
    assert code == 0, out
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    lines = _log_since(node, offset)
    assert _loud(lines) == []
    assert any(f"{STATUS} not cleared: the pod is gone" in line for line in lines)
    assert _stats(node)["failures"] == 0


def test_a_new_pod_of_the_same_name_keeps_its_network_status(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """A StatefulSet's pod deleted and recreated: the new ibv-app-0 (another UID) has its own
    network-status by the time the old sandbox's DEL runs; the PATCH, carrying the old UID, is
    refused by the API server (uid is immutable) and the new pod's annotation stays."""
    conf, pod, uid = _added(node, api, tmp_path)
    new_status = '[{"name": "tke-route-eni", "interface": "eth0", "ips": ["198.51.100.9"]}]'
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-rdma-macvlan", STATUS: new_status})
    offset = _log_size(node)
    code, out = node.run("DEL", conf, "c1", pod, uid=uid)
    assert code == 0, out
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    assert _annotations(api)[STATUS] == new_status
    assert _patches(api)[-1]["metadata"]["uid"] == uid  # DEL asked, for the old pod
    assert _loud(_log_since(node, offset)) == [] and _stats(node)["failures"] == 0


def test_the_pod_is_named_by_the_plan_when_the_del_names_none(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """A DEL whose CNI_ARGS carry no pod (a runtime's cleanup path) clears the pod ADD recorded."""
    conf, pod, uid = _added(node, api, tmp_path)
    code, out = node.run("DEL", conf, "c1", pod, pod="", uid="")
    assert code == 0, out
    assert _annotations(api)[STATUS] == "[]"
    assert _patches(api)[-1]["metadata"]["uid"] == uid


def test_without_the_netns_nothing_is_asked(node: Node, api: KubeServer, tmp_path: Path) -> None:
    conf, pod, uid = _added(node, api, tmp_path)
    written = _annotations(api)[STATUS]
    sh("ip", "netns", "del", pod)
    node.pods.remove(pod)
    api.requests.clear()
    code, out = node.run("DEL", conf, "c1", pod, uid=uid)  # CNI_NETNS names a netns that is gone
    assert code == 0, out
    assert node.leftovers() == CLEAN_NODE
    assert api.requests == [] and _annotations(api)[STATUS] == written


def test_without_a_kubeconfig_nothing_is_asked(node: Node, api: KubeServer, tmp_path: Path) -> None:
    api.add_pod("default", "ibv-app-0", annotations={STATUS: "[]"})
    conf = node.config(None)
    conf["runtimeConfig"] = {"io.kubernetes.cri.pod-annotations": {ANNOTATION: "tke-rdma-macvlan"}}
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c1", pod)
    assert code == 0, result
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    assert api.requests == [] and _stats(node)["failures"] == 0
