"""What a namespace user can make rdma-multus do with a NetworkAttachmentDefinition or a pod annotation,
under the node's policy: NADs of another namespace (Multus's namespaceIsolation) and delegate types
that take a host interface (host-device) or run another meta plugin are refused before any delegate
runs; rdma-multus's own node paths cannot be moved by a config; the pod's own namespace and the
global namespaces still work. The real binary, real delegates, real namespaces, the loopback TLS API
server (tests/kube_server.py) in the node netns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import multus_node
from tests.kube_server import KubeServer
from tests.multus_node import ANNOTATION, CLEAN_NODE, Node, links

pytestmark = [pytest.mark.netns, pytest.mark.tenant]

pki = multus_node.pki
node = multus_node.node
api = multus_node.api


@pytest.fixture
def policed(node: Node, api: KubeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """rdma-multus's config, and the node policy its admin wrote beside it (the same paths)."""
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    keys = ("confDir", "cacheDir", "kubeconfig", "binDirs", "kubeletRootDir", "logFile")
    policy = tmp_path / "node-policy.json"
    policy.write_text(json.dumps({
        "paths": {"rdma-multus": {**{k: conf[k] for k in keys},
                                  "devicePluginDir": str(node.kubelet / "device-plugins")}},
        "networks": {"namespaceIsolation": True, "globalNamespaces": ["rdma-global"]},
    }))  # fmt: skip
    monkeypatch.setenv("RDMA_CNI_NODE_POLICY", str(policy))
    return conf


def macvlan_nad(node: Node, kind: str = "logged-macvlan") -> str:
    return json.dumps({
        "cniVersion": "1.0.0", "type": kind, "master": "bond0", "mode": "bridge", "device": "bond0",
        "ipam": {"type": "host-local", "dataDir": str(node.ipam_dir),
                 "ranges": [[{"subnet": "203.0.113.0/24", "rangeStart": "203.0.113.120",
                              "rangeEnd": "203.0.113.130"}]]}})  # fmt: skip


def refused(node: Node, api: KubeServer, conf: dict[str, Any], ref: str, message: str) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: f"tke-route-eni,{ref}"})
    pod = node.pod_netns()
    code, err = node.run("ADD", conf, "c1", pod)
    assert code != 0 and err["code"] == 7, err
    assert message in err["msg"], err
    assert links(pod) == {"lo"}
    assert node.delegate_calls() == []  # refused while planning: nothing ran
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_a_nad_of_another_namespace_is_refused_naming_the_isolation(
    node: Node, api: KubeServer, policed: dict[str, Any]
) -> None:
    api.add_nad("team-b", "nad-net", macvlan_nad(node))
    refused(node, api, policed, "team-b/nad-net",
            "may not use a NetworkAttachmentDefinition of namespace team-b")
    gets = [r["path"] for r in api.requests if "network-attachment-definitions" in r["path"]]
    assert gets == []  # not even read


@pytest.mark.parametrize("kind", ["host-device", "rdma-multus", "sriov"])
def test_a_nad_naming_a_plugin_the_node_denies_is_refused_before_anything_runs(
    node: Node, api: KubeServer, policed: dict[str, Any], kind: str
) -> None:
    api.add_nad("default", "nad-net", macvlan_nad(node, kind))
    refused(node, api, policed, "nad-net", f"plugin type {kind!r} may not be named")


def test_the_pods_namespace_and_a_global_namespace_still_work(
    node: Node, api: KubeServer, policed: dict[str, Any]
) -> None:
    for namespace, ref in (("default", "nad-net"), ("rdma-global", "rdma-global/nad-net")):
        api.add_nad(namespace, "nad-net", macvlan_nad(node))
        api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: f"tke-route-eni,{ref}"})
        pod = node.pod_netns()
        code, result = node.run("ADD", policed, "c1", pod)
        assert code == 0, result
        assert links(pod) == {"lo", "eth0", "net1"}
        assert node.run("DEL", policed, "c1", pod)[0] == 0
        assert node.leftovers() == CLEAN_NODE


@pytest.mark.parametrize(
    ("key", "value"),
    [("binDirs", ["/tmp/tenant-bin"]), ("cacheDir", "/tmp/tenant-cache"), ("kubeconfig", "/tmp/kc"),
     ("confDir", "/tmp/tenant-conf")],
)
def test_rdma_multus_paths_are_the_nodes(
    node: Node, api: KubeServer, policed: dict[str, Any], key: str, value: Any
) -> None:
    """A NAD may name rdma-multus itself under upstream Multus: its paths stay the node's."""
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-route-eni"})
    pod = node.pod_netns()
    code, err = node.run("ADD", {**policed, key: value}, "c1", pod)
    assert code != 0 and err["code"] == 7 and f"config key {key!r}" in err["msg"], err
    assert links(pod) == {"lo"} and not Path(str(value).strip("[]'")).exists()
