"""The Helm chart (charts/rdma-cni) rendered by real helm: what ``scripts/render-manifests`` writes
into conf/k8s/ for users without Helm, and what the chart's tests compare and install.

    text = template("--set", "rdmaMode=shared")     # helm template, as a user runs it
    files = manifests()                               # conf/k8s path -> the text it must hold

Helm is the test cluster's (``scripts/cluster build`` builds it from helm.sh/helm/v4 and caches it);
``HELM=`` names another.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from cluster import topology
from cluster.build import BuildError
from cluster.node import WORK
from cluster.versions import HELM_BUILD

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rdma-cni"
K8S = REPO / "conf" / "k8s"
RELEASE = "rdma-cni"
NAMESPACE = "kube-system"

HEADER = """\
# Rendered from charts/rdma-cni by `helm template rdma-cni charts/rdma-cni -n kube-system{sets}`
# (scripts/render-manifests): do not edit, change the chart's values instead. With Helm:
#   helm install rdma-cni charts/rdma-cni -n kube-system{sets}
# Without Helm:
#   kubectl label node <nodeName> feature.node.kubernetes.io/tke-shared-rdma=true
#   kubectl apply -f {apply}
#   kubectl -n kube-system get po -o wide -l k8s-app=rdma-cni
# Every parameter (the TKE guide's component parameters, kubeletRootDir, clusterNetwork, rdmaMode,
# frontEnd, Mellanox's config.json, metrics) is a value: charts/rdma-cni/values.yaml.
"""
# conf/k8s/dra/ keeps the three files users apply as a directory: the DRA-only RBAC and admission
# policy, and the DeviceClasses, beside the DaemonSet and what it shares with the default variant.
DRA_SPLIT = {
    "rdma-dra-rbac.yaml": (
        ("ClusterRole", "rdma-cni-dra"),
        ("ClusterRoleBinding", "rdma-cni-dra"),
        ("ValidatingAdmissionPolicy", None),
        ("ValidatingAdmissionPolicyBinding", None),
    ),
    "deviceclasses.yaml": (("DeviceClass", None),),
}


def helm() -> str:
    """The helm to run: $HELM, else the test cluster's cached build."""
    given = os.environ.get("HELM")
    if given:
        return given
    path = HELM_BUILD.bin_dir / "helm"
    if not path.is_file():
        raise BuildError(f"helm {HELM_BUILD.version}: not built (run scripts/cluster build)")
    return str(path)


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """helm ARGS, its output captured; never raises on a non-zero exit (callers read stderr)."""
    env = dict(
        os.environ, HELM_CACHE_HOME="/tmp/rdma-cni-helm/cache", HELM_CONFIG_HOME="/tmp/rdma-cni-helm/config"
    )
    return subprocess.run(
        [helm(), *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def on_cluster(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """helm ARGS against the test cluster, as its admin, from node 1's netns (where the API server
    listens), as :func:`cluster.cluster.kubectl` runs kubectl. ``check``: raise on a non-zero exit."""
    argv = [
        "ip",
        "netns",
        "exec",
        topology.node_netns(1),
        helm(),
        f"--kubeconfig={WORK / 'pki' / 'admin.kubeconfig'}",
    ]
    env = dict(
        os.environ, HELM_CACHE_HOME="/tmp/rdma-cni-helm/cache", HELM_CONFIG_HOME="/tmp/rdma-cni-helm/config"
    )
    proc = subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)}: {proc.stderr.strip()[-2000:]}")
    return proc


# The release the harness installs runs the image under its short name, as its pods' specs then show
# it (the chart's default names docker.io, which kubelet expands the short name to anyway).
HARNESS_IMAGE = ("--set", "image.repository=rdma-cni")


def release_args(verb: str, *sets: str) -> list[str]:
    """``helm install|upgrade rdma-cni charts/rdma-cni -n kube-system SETS`` (:data:`HARNESS_IMAGE` first)."""
    return [verb, RELEASE, str(CHART), "--namespace", NAMESPACE, *HARNESS_IMAGE, *sets]


def history() -> list[dict[str, object]]:
    """The release's revisions (``helm history -o json``): revision, status, description."""
    out: list[dict[str, object]] = json.loads(
        on_cluster("history", RELEASE, "-n", NAMESPACE, "-o", "json").stdout
    )
    return out


def template(*sets: str, hooks: bool = True) -> str:
    """``helm template`` of the chart in kube-system with extra flags (``--set k=v``...); without
    ``hooks``, what ``kubectl apply`` users get (the DRA variant's pre-delete check is Helm's alone)."""
    proc = run(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *sets, *([] if hooks else ["--no-hooks"])
    )
    if proc.returncode != 0:
        raise RuntimeError(f"helm template {' '.join(sets)}: {proc.stderr.strip()}")
    return proc.stdout


def _documents(text: str) -> list[str]:
    """The rendered documents, each with its comments (``# Source:`` first)."""
    return [d.strip("\n") + "\n" for d in re.split(r"^---\n", text, flags=re.MULTILINE) if d.strip()]


def _kind_name(doc: str) -> tuple[str, str]:
    kind = re.search(r"^kind: (\S+)", doc, re.MULTILINE)
    name = re.search(r"^metadata:\n(?:  .*\n)*?  name: (\S+)", doc, re.MULTILINE)
    return (kind.group(1) if kind else "", name.group(1) if name else "")


def _join(docs: list[str], header: str) -> str:
    return header + "".join(f"---\n{d}" for d in docs)


def manifests() -> dict[Path, str]:
    """Every conf/k8s file the chart renders -> its text."""
    out = {
        K8S / "rdma-cni.yaml": _join(
            _documents(template(hooks=False)), HEADER.format(sets="", apply="conf/k8s/rdma-cni.yaml")
        )
    }
    header = HEADER.format(sets=" --set frontEnd=dra", apply="conf/k8s/dra/")
    rest = _documents(template("--set", "frontEnd=dra", hooks=False))
    for name, wanted in DRA_SPLIT.items():
        mine = [d for d in rest if any(_matches(d, kind, n) for kind, n in wanted)]
        rest = [d for d in rest if d not in mine]
        out[K8S / "dra" / name] = _join(mine, header)
    out[K8S / "dra" / "rdma-cni-dra.yaml"] = _join(rest, header)
    return out


def _matches(doc: str, kind: str, name: str | None) -> bool:
    k, n = _kind_name(doc)
    return k == kind and (name is None or n == name)


def main(argv: list[str]) -> int:
    """scripts/render-manifests [--check]: write conf/k8s from the chart, or say what differs."""
    check = argv[:1] == ["--check"]
    stale = []
    for path, text in manifests().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path.relative_to(REPO))
        if not check:
            path.write_text(text)
    verb = "differ from the chart (run scripts/render-manifests)" if check else "rendered"
    for p in stale:
        print(f"{p}: {verb}", file=sys.stderr)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
