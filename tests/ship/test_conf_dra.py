"""conf/k8s/dra/: the DRA variant is the shipped DaemonSet with the driver where the device plugin
was, nothing else changed; the driver's rights are exactly what it calls; the classes and the
example claims say what the README says. (The schema check of every manifest is test_conf_k8s's.)
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

K8S = Path(__file__).resolve().parents[2] / "conf" / "k8s"
DRA = K8S / "dra"
DRIVER = "rdma.tke.cloud.tencent.com"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(path: Path, kind: str, name: str | None = None) -> dict[str, Any]:
    (d,) = [d for d in docs(path) if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return d


def test_the_dra_daemonset_is_the_shipped_one_with_the_driver_instead_of_the_device_plugin() -> None:
    base = one(K8S / "rdma-cni.yaml", "DaemonSet")
    dra = one(DRA / "rdma-cni-dra.yaml", "DaemonSet")
    b, v = base["spec"]["template"]["spec"], dra["spec"]["template"]["spec"]
    assert [c["name"] for c in b["containers"]] == ["rdma-agent", "rdma-device-plugin", "refresh"]
    assert [c["name"] for c in v["containers"]] == ["rdma-agent", "rdma-dra-driver", "refresh"]
    assert b["containers"][0] == v["containers"][0]
    # refresh: the same but for its readiness, which waits for the device plugin's registration only
    # where there is a device plugin
    refresh_b, refresh_v = copy.deepcopy(b["containers"][2]), v["containers"][2]
    check = refresh_b["readinessProbe"]["exec"]["command"]
    at = check.index("--device-plugin-status")
    del check[at : at + 2]
    refresh_b["volumeMounts"] = [m for m in refresh_b["volumeMounts"] if m["name"] != "pod-status"]
    assert "--device-plugin-status" not in refresh_v["readinessProbe"]["exec"]["command"]
    assert refresh_b == refresh_v
    assert b["initContainers"] == v["initContainers"]
    vols_b = {x["name"]: x for x in b["volumes"]}
    vols_v = {x["name"]: x for x in v["volumes"]}
    # npwg-devinfo: the device plugin's NPWG device-info files for upstream Multus (issue 36)
    # pod-status: the device plugin's own status, which the refresh container's readiness reads
    assert set(vols_b) - set(vols_v) == {"device-plugins", "pod-resources", "npwg-devinfo", "pod-status"}
    assert set(vols_v) - set(vols_b) == {"kubelet-plugins", "plugins-registry", "cdi"}
    assert all(vols_b[n] == vols_v[n] for n in set(vols_b) & set(vols_v))
    rest_b, rest_v = copy.deepcopy(base), copy.deepcopy(dra)
    for doc in (rest_b, rest_v):
        spec = doc["spec"]["template"]["spec"]
        del spec["containers"], spec["volumes"]
    # the DRA driver's sockets have fixed names: its rollout goes one node at a time, no surge
    one_at_a_time = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    assert rest_v["spec"].pop("updateStrategy") == one_at_a_time
    assert rest_b["spec"].pop("updateStrategy")["rollingUpdate"]["maxSurge"] == 1
    assert rest_b == rest_v


def test_the_driver_runs_the_nodes_bundle_with_the_kubelet_paths_at_their_node_paths() -> None:
    v = one(DRA / "rdma-cni-dra.yaml", "DaemonSet")["spec"]["template"]["spec"]
    c = next(c for c in v["containers"] if c["name"] == "rdma-dra-driver")
    assert c["command"] == ["/opt/cni/bin/rdma-cni.d/current/rdma-cni", "rdma-dra-driver"]
    args = dict(zip(c["args"][::2], c["args"][1::2], strict=True))
    assert args["--config"] == "/etc/rdma-cni/device-plugin.yaml" and args["--cdi-dir"] == "/var/run/cdi"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    hostpaths = {x["name"]: x.get("hostPath", {}).get("path") for x in v["volumes"]}
    for name in ("kubelet-plugins", "plugins-registry", "cdi"):
        assert mounts[name] == hostpaths[name], "kubelet dials the path the driver registers"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["securityContext"]["privileged"] is False


def test_the_drivers_rights_are_what_it_calls_and_the_policy_keeps_it_to_its_node() -> None:
    rbac = DRA / "rdma-dra-rbac.yaml"
    rules = one(rbac, "ClusterRole", "rdma-cni-dra")["rules"]
    got = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert got == {
        ("resource.k8s.io", "resourceclaims", "get"),
        ("", "nodes", "get"),
        *{("resource.k8s.io", "resourceslices", v) for v in ("list", "watch", "create", "update", "delete")},
    }
    binding = one(rbac, "ClusterRoleBinding", "rdma-cni-dra")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rdma-cni", "namespace": "kube-system"}]
    vap = one(rbac, "ValidatingAdmissionPolicy")
    assert "system:serviceaccount:kube-system:rdma-cni" in vap["spec"]["matchConditions"][0]["expression"]
    assert {"CREATE", "UPDATE", "DELETE"} == set(
        vap["spec"]["matchConstraints"]["resourceRules"][0]["operations"]
    )
    assert one(rbac, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == vap["metadata"]["name"]


def test_the_exclusive_class_serves_the_seeds_extended_resource_and_the_shared_one_none() -> None:
    ex = one(DRA / "deviceclasses.yaml", "DeviceClass", DRIVER)
    sh = one(DRA / "deviceclasses.yaml", "DeviceClass", f"rdma-shared.{'tke.cloud.tencent.com'}")
    assert ex["spec"]["extendedResourceName"] == "tke.cloud.tencent.com/tke-shared-rdma"
    assert "extendedResourceName" not in sh["spec"]
    assert "!device.allowMultipleAllocations" in ex["spec"]["selectors"][0]["cel"]["expression"]
    assert sh["spec"]["selectors"][0]["cel"]["expression"].endswith("&& device.allowMultipleAllocations")


def test_the_pair_examples_constrain_each_gpu_and_nic_pair_by_pcie_root() -> None:
    for n in (1, 2, 4, 8):
        tmpl = one(DRA / "examples" / f"gpu-nic-pairs-{n}.yaml", "ResourceClaimTemplate")
        devices = tmpl["spec"]["spec"]["devices"]
        assert len(devices["requests"]) == 2 * n
        assert devices["constraints"] == [
            {"requests": [f"gpu-{i}", f"nic-{i}"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
            for i in range(n)
        ]
        pod = one(DRA / "examples" / f"gpu-nic-pairs-{n}.yaml", "Pod")
        assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == tmpl["metadata"]["name"]
    numa = one(DRA / "examples" / "gpus-and-nics-one-numa-node.yaml", "ResourceClaimTemplate")
    assert (
        numa["spec"]["spec"]["devices"]["constraints"][0]["matchAttribute"]
        == "resource.kubernetes.io/numaNode"
    )
