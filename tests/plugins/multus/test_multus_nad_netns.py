"""rdma-multus and the Kubernetes API beyond the pod: the network-status annotation it writes and the
NetworkAttachmentDefinitions it reads — the real binary, real delegates, real namespaces, the
loopback TLS API server (tests/kube_server.py) inside the node netns.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests import multus_node
from tests.kube_server import KubeServer
from tests.multus_node import ANNOTATION, CLEAN_NODE, RESOURCE, Node, addrs, links, sh

pytestmark = pytest.mark.netns

# The same node, API server and PKI fixtures as the rest of rdma-multus's netns tests.
pki = multus_node.pki
node = multus_node.node
api = multus_node.api

STATUS = "k8s.v1.cni.cncf.io/network-status"


def mac(netns: str, ifname: str) -> str:
    (link,) = json.loads(sh("ip", "-n", netns, "-j", "link", "show", "dev", ifname).stdout)
    return str(link["address"])


def written_status(server: KubeServer, name: str = "ibv-app-0") -> list[dict[str, Any]]:
    value = json.loads(server.pods[("default", name)]["metadata"]["annotations"][STATUS])
    assert isinstance(value, list)
    return value


def stats(node: Node) -> dict[str, Any]:
    data = json.loads((node.cache_dir / "stats" / "network-status.json").read_text())
    assert isinstance(data, dict)
    return data


def nad_config(**extra: Any) -> str:
    return json.dumps({
        "cniVersion": "1.0.0", "type": "logged-macvlan", "master": "bond0", "mode": "bridge",
        "ipam": {"type": "host-local", "dataDir": extra.pop("ipam_dir"),
                 "ranges": [[{"subnet": "203.0.113.0/24", "rangeStart": "203.0.113.120",
                              "rangeEnd": "203.0.113.130"}]]}, **extra})  # fmt: skip


def test_add_writes_network_status_as_multus_does_for_the_same_networks(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-route-eni,tke-rdma-macvlan")
    # Multus's entries for ptp (2 interfaces: the pod's eth0 is the default; ptp's default route has
    # no gateway, which Go prints as <nil>) and for macvlan (1 interface: all its IPs), from the
    # live pod, not from our result.
    assert written_status(api) == [
        {"name": "tke-route-eni", "interface": "eth0", "ips": [addrs(pod, "eth0")[0].split("/")[0]],
         "mac": mac(pod, "eth0"), "default": True, "dns": {}, "gateway": ["<nil>"]},
        {"name": "default/tke-rdma-macvlan", "interface": "net1", "ips": ["203.0.113.64"],
         "mac": mac(pod, "net1"), "dns": {}},
    ]  # fmt: skip
    patches = [r for r in api.requests if r["method"] == "PATCH"]
    assert [r["path"] for r in patches] == ["/api/v1/namespaces/default/pods/ibv-app-0/status"]
    assert set(json.loads(patches[0]["body"])["metadata"]["annotations"]) == {STATUS}
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_forbidden_patch_is_logged_and_counted_and_the_pod_starts(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-route-eni,tke-rdma-macvlan"})
    api.forbid = {"patch"}
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c1", pod)
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "net1"}
    assert STATUS not in api.pods[("default", "ibv-app-0")]["metadata"]["annotations"]
    counted = stats(node)
    assert counted["failures"] == 1
    assert "403" in counted["lastError"] and "pods/status" in counted["lastError"]
    assert "not written (the pod's networks are up)" in (node.root / "multus.log").read_text()
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_a_slow_api_bounds_the_patch_by_the_api_timeout_and_the_pod_starts(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf = node.config(api.kubeconfig(tmp_path / "kc"))  # apiTimeoutSeconds 3, 2 attempts
    conf["runtimeConfig"] = {"io.kubernetes.cri.pod-annotations": {ANNOTATION: "tke-rdma-macvlan"}}
    api.add_pod("default", "ibv-app-0", uid="u-slow")
    node.checkpoint("u-slow", ["0"])  # no GET of the pod is needed: the PATCH is the only call
    api.delay = 5.0
    pod = node.pod_netns()
    start = time.monotonic()
    code, result = node.run("ADD", conf, "c1", pod, uid="u-slow")
    took = time.monotonic() - start
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "net1"}
    assert "unreachable" in stats(node)["lastError"]
    print(f"ADD with an API that never answers in time: {took:.1f} s (apiTimeoutSeconds 3)")
    api.delay = 0
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


@pytest.mark.parametrize("namespace_in_annotation", [False, True])
def test_network_without_a_config_file_comes_from_its_network_attachment_definition(
    node: Node, api: KubeServer, tmp_path: Path, namespace_in_annotation: bool
) -> None:
    nad_ns = "rdma-jobs" if namespace_in_annotation else "default"
    ref = f"{nad_ns}/nad-net" if namespace_in_annotation else "nad-net"
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: f"tke-route-eni,{ref}"})
    api.add_nad(nad_ns, "nad-net", nad_config(ipam_dir=str(node.ipam_dir)),
                annotations={"k8s.v1.cni.cncf.io/resourceName": RESOURCE})  # fmt: skip
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c1", pod)
    assert code == 0, result
    assert addrs(pod, "net1") == ["203.0.113.120/24"]
    gets = [r["path"] for r in api.requests if "network-attachment-definitions" in r["path"]]
    assert gets == [f"/apis/k8s.cni.cncf.io/v1/namespaces/{nad_ns}/network-attachment-definitions/nad-net"]
    (add,) = [c for c in node.delegate_calls() if c["cmd"] == "ADD" and c["ifname"] == "net1"]
    assert add["stdin"]["name"] == "nad-net"  # the config had no name: the object's
    assert add["stdin"]["resourceName"] == RESOURCE  # from the object's resourceName annotation
    assert [e["name"] for e in written_status(api)] == ["tke-route-eni", f"{nad_ns}/nad-net"]
    api.stop()  # DEL replays the stored config: no API needed
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "no NetworkAttachmentDefinition default/nad-net in the Kubernetes API"),
        ("{not json", "NetworkAttachmentDefinition default/nad-net: spec.config is not valid JSON"),
        ("", "NetworkAttachmentDefinition default/nad-net: spec.config is empty or missing"),
        ('["a"]', "NetworkAttachmentDefinition default/nad-net: spec.config must be a JSON object"),
        ('{"cniVersion": "1.0.0"}', "NetworkAttachmentDefinition default/nad-net spec.config: field 'type'"),
    ],
)
def test_missing_or_malformed_definition_fails_add_naming_it_and_leaves_nothing(
    node: Node, api: KubeServer, tmp_path: Path, config: str | None, message: str
) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-route-eni,nad-net"})
    if config is not None:
        api.add_nad("default", "nad-net", config)
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    pod = node.pod_netns()
    code, err = node.run("ADD", conf, "c1", pod)
    assert code != 0 and err["code"] == 7, err
    assert message in err["msg"]
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE
    assert node.delegate_calls() == []  # refused while planning: nothing ran


def test_definition_the_node_may_not_read_names_the_rbac_fix(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    conf["runtimeConfig"] = {"io.kubernetes.cri.pod-annotations": {ANNOTATION: "nad-net"}}
    api.forbid = {"get"}
    pod = node.pod_netns()
    code, err = node.run("ADD", conf, "c1", pod)
    assert code != 0
    assert "grant the node's identity 'get' on network-attachment-definitions" in err["msg"]
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE
