"""The pinned versions of everything the test cluster runs, and where their builds are cached.

One place, so that the cache key, the README and the go.mod files cannot disagree: a build is
cached under ``/var/cache/rdma-cni/cluster/<name>-<version>-<hash of its go.mod and go.sum>/``, so
a second ``scripts/cluster build`` builds nothing and a changed pin builds again.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE_ROOT = Path(os.environ.get("RDMA_CNI_CLUSTER_CACHE", "/var/cache/rdma-cni/cluster"))

KUBERNETES = "v1.37.2"
ETCD = "v3.6.16"
# containerd's RELEASES.md pairs Kubernetes 1.37 with 2.4.0+ and 2.3.0+.
CONTAINERD = "v2.4.2"
# helm.sh/helm/v4: the chart's tests run the Helm users run (v4: server-side apply by default, kstatus
# waits); chart apiVersion v2 is what both Helm 3 and 4 read.
HELM = "v4.3.2"
# gopkg.in/k8snetworkplumbingwg/multus-cni.v4: the meta plugin NVIDIA network-operator's users run.
# v4.2.3 (the proxy also serves v4.2.4 and v4.3.0): the release the facts were read from;
# it keeps kubelet's device ID order (v4.3.0 sorts them) and reads DRA devices from PodResources only.
MULTUS = "v4.2.3"
MULTUS_MODULE = "gopkg.in/k8snetworkplumbingwg/multus-cni.v4"


@dataclass(frozen=True)
class GoBuild:
    """One cached Go build: the main packages of a module graph pinned by a go.mod of ours."""

    name: str
    version: str
    gomod_dir: Path  # holds go.mod (+ go.sum); "" for a module built by path@version
    packages: tuple[str, ...]
    ldflags: str = ""
    cgo: bool = False
    tags: str = ""
    rename: tuple[tuple[str, str], ...] = ()  # (what go names it, what we call it)

    @property
    def key(self) -> str:
        h = hashlib.sha256(f"{self.packages}{self.ldflags}{self.cgo}{self.tags}".encode())
        for f in ("go.mod", "go.sum"):
            p = self.gomod_dir / f
            if p.exists():
                h.update(p.read_bytes())
        return f"{self.name}-{self.version}-{h.hexdigest()[:10]}"

    @property
    def bin_dir(self) -> Path:
        return CACHE_ROOT / self.key / "bin"

    def go_names(self) -> list[str]:
        """What ``go build -o DIR/`` names each binary: the last path element, but a major version
        suffix (``/v3``) names it after the element before."""
        out = []
        for p in self.packages:
            parts = p.split("/")
            last = parts[-1]
            out.append(parts[-2] if last[:1] == "v" and last[1:].isdigit() else last)
        return out

    def binaries(self) -> list[str]:
        names = dict(self.rename)
        return [names.get(n, n) for n in self.go_names()]


def _k8s_ldflags(version: str) -> str:
    """The version stamps Kubernetes' own build sets: kubelet reports it as the node's kubeletVersion
    and kubectl's version skew check reads it (an unstamped build says v0.0.0-master)."""
    major, minor = version.lstrip("v").split(".")[:2]
    x = [
        f"k8s.io/component-base/version.gitVersion={version}",
        f"k8s.io/component-base/version.gitMajor={major}",
        f"k8s.io/component-base/version.gitMinor={minor}",
        "k8s.io/component-base/version.gitTreeState=clean",
        f"k8s.io/client-go/pkg/version.gitVersion={version}",
        f"k8s.io/client-go/pkg/version.gitMajor={major}",
        f"k8s.io/client-go/pkg/version.gitMinor={minor}",
    ]
    return "-s -w " + " ".join(f"-X {v}" for v in x)


KUBE = GoBuild(
    "kubernetes",
    KUBERNETES,
    HERE / "gomod-kubernetes",
    tuple(
        f"k8s.io/kubernetes/cmd/{c}"
        for c in (
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kube-proxy",
            "kubelet",
            "kubectl",
        )
    ),
    _k8s_ldflags(KUBERNETES),
)
ETCD_BUILD = GoBuild(
    "etcd", ETCD, HERE / "gomod-etcd", ("go.etcd.io/etcd/server/v3",), "-s -w", rename=(("server", "etcd"),)
)
CONTAINERD_BUILD = GoBuild(
    "containerd",
    CONTAINERD,
    HERE / "gomod-containerd",
    tuple(
        f"github.com/containerd/containerd/v2/cmd/{c}"
        for c in ("containerd", "containerd-shim-runc-v2", "ctr")
    ),
    f"-s -w -X github.com/containerd/containerd/v2/version.Version={CONTAINERD}",
    tags="no_btrfs no_devmapper no_zfs",
)
HELM_BUILD = GoBuild(
    "helm",
    HELM,
    HERE / "gomod-helm",
    ("helm.sh/helm/v4/cmd/helm",),
    # Helm's Makefile stamps the same: `helm version` says the tag, with no "unreleased" metadata.
    f"-s -w -X helm.sh/helm/v4/internal/version.version={HELM} -X helm.sh/helm/v4/internal/version.metadata=",
)
MULTUS_BUILD = GoBuild(
    "multus",
    MULTUS,
    HERE / "gomod-multus",
    tuple(
        f"{MULTUS_MODULE}/cmd/{c}"
        for c in (
            "multus", "multus-daemon", "multus-shim", "install_multus", "thin_entrypoint", "passthru-cni"
        )
    ),
    # hack/build-go.sh's stamps: `multus --version` says the release, not master@git
    f"-s -w -X {MULTUS_MODULE}/pkg/multus.version={MULTUS} -X {MULTUS_MODULE}/pkg/multus.gitTreeState=clean",
    # install_multus copies bin/passthru beside the plugin, and fails without it
    rename=(("passthru-cni", "passthru"),),
)
BUILDS = (KUBE, ETCD_BUILD, CONTAINERD_BUILD, HELM_BUILD, MULTUS_BUILD)
