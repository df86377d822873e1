"""The Kubernetes manifests of conf/k8s: a schema check against the API's own models, plus the seed's
parameters. The models are the kubernetes client's (pydantic, unknown fields forbidden, types and
required fields checked). kubectl's --dry-run=client would be the other way, but it downloads the
schema from an API server, which a test here cannot have.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "conf" / "k8s"
MODES = {"global-router": "tke-bridge", "vpc-cni": "tke-route-eni"}
RDMA_LABEL = "feature.node.kubernetes.io/tke-shared-rdma"
RDMA_RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
ANNOTATION = "tke.cloud.tencent.com/networks"

# kubernetes >= 37: its API models are pydantic (extra fields forbidden), which is what the check uses.
pytest.importorskip("kubernetes", minversion="37", reason="schema check needs the kubernetes client >= 37")
kube_client = pytest.importorskip("kubernetes.client")
yaml = pytest.importorskip("yaml")

API_GROUPS = {
    "ServiceAccount": "v1",
    "Pod": "v1",
    "ConfigMap": "v1",
    "DaemonSet": "apps/v1",
    "StatefulSet": "apps/v1",
    "Deployment": "apps/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
}
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def manifests() -> list[Path]:
    return sorted(K8S.rglob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def schema_problems(doc: dict[str, Any]) -> list[str]:
    kind = doc.get("kind", "")
    if API_GROUPS.get(kind) != doc.get("apiVersion"):
        return [f"{kind}: apiVersion {doc.get('apiVersion')!r}, expected {API_GROUPS.get(kind)!r}"]
    model = getattr(kube_client, f"V1{kind}")
    try:
        model.model_validate(doc)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError lists every problem
        return [f"{kind}: {exc}"]
    problems = []
    for path, value in _walk(doc):
        if re.search(r"resources\.(limits|requests)\.[^.]+$", path) and not QUANTITY.match(str(value)):
            problems.append(f"{path}: {value!r} is not a resource quantity")
    return problems


def _walk(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [pair for k, v in node.items() for pair in _walk(v, f"{prefix}.{k}" if prefix else k)]
    if isinstance(node, list):
        return [pair for i, v in enumerate(node) for pair in _walk(v, f"{prefix}[{i}]")]
    return [(prefix, node)]


def test_every_manifest_passes_the_schema_check() -> None:
    files = manifests()
    assert {p.name for p in files} >= {"rdma-cni.yaml", "ibv-app.yaml", "nccl-test.yaml", "rdma-pod.yaml"}
    for path in files:
        for doc in documents(path):
            assert schema_problems(doc) == [], path


def test_schema_check_catches_typos_types_and_missing_fields() -> None:
    ds = next(d for d in documents(K8S / "rdma-cni.yaml") if d["kind"] == "DaemonSet")
    container = ["spec", "template", "spec", "containers", 0]
    for mutate in (
        lambda d: _at(d, container).update(imagee="x"),  # unknown field
        lambda d: _at(d, container).pop("name"),  # required field
        lambda d: _at(d, ["spec", "template", "spec"]).update(hostNetwork="yes"),  # wrong type
        lambda d: _at(d, [*container, "resources", "limits"]).update(cpu="fifty"),  # bad quantity
        lambda d: d.update(apiVersion="extensions/v1beta1"),
    ):
        bad = copy.deepcopy(ds)
        mutate(bad)
        assert schema_problems(bad), bad


def _at(doc: Any, path: list[Any]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _daemonset() -> dict[str, Any]:
    return next(d for d in documents(K8S / "rdma-cni.yaml") if d["kind"] == "DaemonSet")


def test_daemonset_carries_the_seed_component_parameters() -> None:
    ds = _daemonset()
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {RDMA_LABEL: "true"}
    for c in pod["containers"] + pod["initContainers"]:
        assert c["resources"] == {
            "requests": {"cpu": "10m", "memory": "100Mi"},
            "limits": {"cpu": "50m", "memory": "500Mi"},
        }, c["name"]
        env = {e["name"]: e["value"] for e in c.get("env", [])}
        assert env["KUBELET_ROOT_DIR"] == "/var/lib/kubelet"
        assert env["CLUSTER_MODE"] in MODES
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert host_paths["kubelet-root"] == "/var/lib/kubelet"
    assert host_paths["cni-bin"] == "/opt/cni/bin" and host_paths["cni-conf"] == "/etc/cni/net.d"
    install = pod["initContainers"][0]
    assert install["command"] == ["/opt/rdma-cni/install.sh"]
    args = install["args"]
    assert args[args.index("--host-root") + 1] == "/host"  # configs must name node paths
    assert args[args.index("--mode") + 1] == "$(CLUSTER_MODE)"
    assert args[args.index("--kubelet-root-dir") + 1] == "$(KUBELET_ROOT_DIR)"


def test_rbac_lets_the_daemonset_get_pods_and_nothing_more() -> None:
    docs = {d["kind"]: d for d in documents(K8S / "rdma-cni.yaml")}
    sa = docs["ServiceAccount"]["metadata"]
    assert docs["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]
    assert docs["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    assert binding["subjects"] == [subject]


def _workload_pods() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    out = []
    for path in sorted((K8S / "examples").glob("*.yaml")):
        for doc in documents(path):
            template = doc if doc["kind"] == "Pod" else doc["spec"]["template"]
            out.append((path.name, template["metadata"], template["spec"]))
    return out


def test_example_workloads_ask_for_the_rdma_plane_as_the_seed_does() -> None:
    pods = _workload_pods()
    assert len(pods) == 3
    networks = {f"{default},tke-rdma-macvlan" for default in MODES.values()}
    for name, meta, spec in pods:
        assert meta["annotations"][ANNOTATION] in networks, name
        for c in spec["containers"]:
            assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"], name
            assert int(c["resources"]["limits"][RDMA_RESOURCE]) >= 1, name
            gpus = c["resources"]["limits"].get("nvidia.com/gpu")
            assert gpus is None or gpus == c["resources"]["limits"][RDMA_RESOURCE], name
        assert spec["nodeSelector"] == {RDMA_LABEL: "true"}, name
