"""A namespace user on the test cluster (docs/security.md): a namespace whose Role grants pods and
NetworkAttachmentDefinitions there only, used through ``kubectl --as``, and what their pods were told.

    w.apply(bins, rbac())
    as_tenant(bins, "apply", "-f", "-", stdin=nad("node-nic", {"type": "rdma-macvlan", ...}))
    said = refusal(bins, "t-node-nic")   # the pod's FailedCreatePodSandBox message, once there
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from cluster.build import Binaries
from cluster.cluster import kubectl

USER, NAMESPACE = "tenant-a", "team-a"


def rbac(namespace: str = NAMESPACE, user: str = USER) -> str:
    """The namespace, a Role of pods and NADs in it, and its binding to ``user``."""
    return yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pods-and-nads", "namespace": namespace},
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["create", "get", "list", "watch", "delete"]},
                   {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["network-attachment-definitions"],
                    "verbs": ["create", "get", "list", "delete"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": user, "namespace": namespace},
         "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
         "roleRef": {"kind": "Role", "name": "pods-and-nads", "apiGroup": "rbac.authorization.k8s.io"}},
    ])  # fmt: skip


def as_tenant(bins: Binaries, *args: str, stdin: str | None = None, namespace: str = NAMESPACE) -> str:
    return kubectl(bins, "--as", USER, "-n", namespace, *args, stdin=stdin).stdout


def nad(name: str, config: dict[str, Any], namespace: str = NAMESPACE) -> str:
    return yaml.safe_dump({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                           "metadata": {"name": name, "namespace": namespace},
                           "spec": {"config": json.dumps({"cniVersion": "1.0.0", "name": name, **config})}})


def refusal(bins: Binaries, name: str, namespace: str = NAMESPACE) -> str | None:
    """The last FailedCreatePodSandBox message of pod ``name``, None before kubelet reported one."""
    events = json.loads(kubectl(bins, "-n", namespace, "get", "events", "-o", "json", "--field-selector",
                                f"involvedObject.name={name}").stdout)["items"]
    said = [e["message"] for e in events if e.get("reason") == "FailedCreatePodSandBox"]
    return said[-1] if said else None


def forbidden_elsewhere(bins: Binaries, namespace: str = "default") -> bool:
    """The Role is what the test thinks: the user may not even list another namespace's pods."""
    proc = kubectl(bins, "--as", USER, "-n", namespace, "get", "pods", check=False)
    return proc.returncode != 0 and "forbidden" in proc.stderr
