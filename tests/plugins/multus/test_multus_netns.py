"""rdma-multus end to end: the real binary, real delegate plugins, real namespaces, a real TLS API
(the node: ``tests/multus_node.py``). ADD, CHECK and GC of the pod's networks, how the networks are
found (API, runtime annotations, JSON annotations), and the errors that stop an ADD before anything
runs; DEL, and what rdma-multus does when a DEL or an ADD fails part way, are in
``test_multus_del_netns.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from netns import policy_env

from tests import multus_node
from tests.kube_server import KubeServer
from tests.multus_node import ANNOTATION, CLEAN_NODE, RESOURCE, Node, addrs, links, reachable, sh

pytestmark = pytest.mark.netns

# The node, API server and PKI fixtures of rdma-multus's netns tests (tests/multus_node.py).
pki = multus_node.pki
node = multus_node.node
api = multus_node.api


def test_tke_pod_gets_eth0_from_default_and_net1_from_the_rdma_network(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    uid = str(uuid.uuid4())
    api.add_pod("default", "ibv-app-0", uid=uid, annotations={ANNOTATION: "tke-route-eni,tke-rdma-macvlan"},
                limits={RESOURCE: "2"})  # fmt: skip
    node.checkpoint(uid, ["0", "1"])
    conf = node.config(api.kubeconfig(tmp_path / "kc", auth="cert"))
    pod = node.pod_netns()

    code, result = node.run("ADD", conf, "c1", pod, uid=uid)
    assert code == 0, result
    assert [i["name"] for i in result["interfaces"] if i.get("sandbox")] == ["eth0", "net1"]
    assert addrs(pod, "eth0")[0].startswith("198.51.100.") and addrs(pod, "net1") == ["203.0.113.64/24"]
    result_ips = {ip["address"] for ip in result["ips"]}
    assert result_ips == {addrs(pod, "eth0")[0], "203.0.113.64/24"}
    assert reachable(pod, "203.0.113.1")

    (add,) = [c for c in node.delegate_calls() if c["cmd"] == "ADD"]
    assert add["ifname"] == "net1"
    assert add["stdin"]["runtimeConfig"]["deviceIDs"] == ["0", "1"]
    assert add["stdin"]["deviceID"] == "0" and add["stdin"]["count"] == 2
    assert f"K8S_POD_UID={uid}" in add["args"]

    code, out = node.run("CHECK", {**conf, "prevResult": result}, "c1", pod, uid=uid)
    assert code == 0, out

    code, out = node.run("DEL", conf, "c1", pod, uid=uid)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_failing_second_delegate_leaves_nothing_behind(node: Node, api: KubeServer, tmp_path: Path) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-route-eni,h5-broken"})
    pod = node.pod_netns()
    code, err = node.run("ADD", node.config(api.kubeconfig(tmp_path / "kc")), "c1", pod)
    assert code != 0
    assert "h5-broken" in err["msg"] and "net1" in err["msg"]
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_containerd_annotations_in_runtime_config_skip_the_api(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    conf["runtimeConfig"] = {
        "io.kubernetes.cri.pod-annotations": {ANNOTATION: "tke-route-eni,tke-rdma-macvlan"}
    }
    pod = node.pod_netns()
    node.checkpoint("uid-1", ["3"])
    code, result = node.run("ADD", conf, "c1", pod, pod="not-in-the-api", uid="uid-1")
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "net1"}
    # No GET: the only call is the network-status PATCH, refused (404) for a pod the API does not
    # have, which is counted and does not fail the ADD.
    assert [r["method"] for r in api.requests] == ["PATCH"]
    (add,) = [c for c in node.delegate_calls() if c["cmd"] == "ADD"]
    assert add["stdin"]["runtimeConfig"]["deviceIDs"] == ["3"]
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert node.leftovers() == CLEAN_NODE


def test_pod_without_annotation_gets_only_the_default_network(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0")
    conf = node.config(api.kubeconfig(tmp_path / "kc", auth="tokenFile"), version="0.4.0")
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c1", pod)
    assert code == 0, result
    assert result["cniVersion"] == "0.4.0" and result["ips"][0]["version"] == "4"
    assert links(pod) == {"lo", "eth0"}
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_recreated_pod_with_another_uid_is_refused_before_anything_runs(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0", uid="new-uid", annotations={ANNOTATION: "tke-rdma-macvlan"})
    pod = node.pod_netns()
    code, err = node.run("ADD", node.config(api.kubeconfig(tmp_path / "kc")), "c1", pod, uid="old-uid")
    assert code != 0 and err["code"] == 106 and "recreated" in err["msg"]
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_api_server_down_at_add_is_a_clear_error(node: Node, api: KubeServer, tmp_path: Path) -> None:
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    api.stop()
    pod = node.pod_netns()
    code, err = node.run("ADD", conf, "c1", pod)
    assert code != 0 and err["code"] == 106 and "unreachable" in err["msg"]
    assert node.leftovers() == CLEAN_NODE


def test_check_notices_a_lost_address_on_the_rdma_interface(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, result = node.added_pod(api, tmp_path, "tke-rdma-macvlan")
    sh("ip", "-n", pod, "addr", "flush", "dev", "net1")
    code, err = node.run("CHECK", {**conf, "prevResult": result}, "c1", pod)
    assert code != 0 and "203.0.113.64" in err["msg"] and "net1" in err["msg"]
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_gc_removes_attachments_the_runtime_no_longer_knows(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-rdma-macvlan"})
    conf = node.config(api.kubeconfig(tmp_path / "kc"), version="1.1.0")
    pods = [node.pod_netns(), node.pod_netns()]
    for i, pod in enumerate(pods):
        code, result = node.run("ADD", conf, f"c{i}", pod)
        assert code == 0, result
    gc = {**conf, "cni.dev/valid-attachments": [{"containerID": "c0", "ifname": "eth0"}]}
    code, out = node.run("GC", gc, "", None, ifname="")
    assert code == 0, out
    assert links(pods[0]) == {"lo", "eth0", "net1"}
    assert links(pods[1]) == {"lo"}
    assert node.run("DEL", conf, "c0", pods[0])[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_missing_delegate_binary_fails_before_anything_runs(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    node.network("h5-ghost", {"plugins": [{"type": "no-such-plugin"}]})
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "h5-ghost"})
    pod = node.pod_netns()
    code, err = node.run("ADD", node.config(api.kubeconfig(tmp_path / "kc")), "c1", pod)
    assert code != 0 and err["code"] == 7 and "no-such-plugin" in err["msg"]
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE


def test_version_and_help_need_no_config() -> None:
    env = {**os.environ, "CNI_COMMAND": "VERSION"}
    cmd = [sys.executable, "-m", "rdma_cni.cli.multus"]
    proc = subprocess.run(cmd, env=env, input="", capture_output=True, text=True)
    assert proc.returncode == 0 and "1.1.0" in json.loads(proc.stdout)["supportedVersions"]
    assert shutil.which("ip") is not None


def test_json_annotation_sets_interface_name_mac_and_cni_args(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    text = json.dumps(
        [
            {
                "name": "tke-rdma-macvlan",
                "interface": "rdma7",
                "mac": "02:00:00:00:00:42",
                "cni-args": {"k": "v"},
            }
        ]
    )
    conf, pod, _ = node.added_pod(api, tmp_path, text)
    link = json.loads(sh("ip", "-n", pod, "-j", "link", "show", "rdma7").stdout)[0]
    assert link["address"] == "02:00:00:00:00:42"  # via runtimeConfig.mac: the plugin declares it
    (add,) = [c for c in node.delegate_calls() if c["cmd"] == "ADD"]
    assert add["stdin"]["args"] == {"cni": {"k": "v"}} and "MAC=02:00:00:00:00:42" in add["args"]
    assert "deviceIDs" not in add["stdin"].get("runtimeConfig", {})  # no checkpoint, no count: nothing
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_runtime_annotations_and_an_unreachable_api_still_start_the_pod(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    conf["runtimeConfig"] = {"io.kubernetes.cri.pod-annotations": {ANNOTATION: "tke-rdma-macvlan"}}
    api.stop()
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c1", pod, uid="no-checkpoint-entry")
    assert code == 0, result  # the device count is unknown, so the delegate uses its own default
    assert links(pod) == {"lo", "eth0", "net1"}
    stats = json.loads((node.cache_dir / "stats" / "network-status.json").read_text())
    assert stats["failures"] == 1 and "unreachable" in stats["lastError"]
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_concurrent_pods_each_get_their_networks_and_the_token_is_never_logged(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-route-eni,tke-rdma-macvlan"})
    conf = node.config(api.kubeconfig(tmp_path / "kc", auth="token"), logLevel="debug")
    pods = [node.pod_netns() for _ in range(4)]

    def run(command: str, i: int) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ["PATH"], "CNI_COMMAND": command, **policy_env(), "CNI_CONTAINERID": f"c{i}",
            "CNI_NETNS": f"/var/run/netns/{pods[i]}", "CNI_IFNAME": "eth0", "CNI_PATH": str(node.bin_dir),
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=ibv-app-0",
        }  # fmt: skip
        cmd = ["ip", "netns", "exec", node.name, sys.executable, "-m", "rdma_cni.cli.multus"]
        return subprocess.run(
            cmd, input=json.dumps(conf), capture_output=True, text=True, env=env, timeout=120
        )

    for command in ("ADD", "DEL"):
        with ThreadPoolExecutor(len(pods)) as pool:
            done = list(pool.map(lambda i: run(command, i), range(len(pods))))  # noqa: B023
        for proc in done:
            assert proc.returncode == 0, (proc.stdout, proc.stderr)
            assert api.token not in proc.stderr
        if command == "ADD":
            assert all(links(p) == {"lo", "eth0", "net1"} for p in pods)
            net1 = sorted(addrs(p, "net1")[0] for p in pods)
            assert len(set(net1)) == 4  # host-local gave each pod its own address
    assert all(links(p) == {"lo"} for p in pods)
    assert node.leftovers() == CLEAN_NODE
    log_text = (node.root / "multus.log").read_text()
    assert "delegate ADD tke-rdma-macvlan" in log_text and api.token not in log_text


def test_multus_refuses_its_own_netns_and_passes_the_override_on(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-rdma-macvlan"})
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    code, err = node.run("ADD", conf, "c1", node.name)  # the node netns: where the plugin runs
    assert code != 0 and err["code"] == 8, err
    assert err["msg"] == "plugin's netns and netns from CNI_NETNS should not be the same"
    assert node.leftovers() == CLEAN_NODE
    assert node.delegate_calls() == []
