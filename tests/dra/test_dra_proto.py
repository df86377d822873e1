"""kubelet's DRA, health and plugin-registration protos: the gRPC method paths kubelet calls, and the
vendored files equal to k8s.io/kubelet@v0.37.2's in the Go module cache (when this machine has it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rdma_cni.proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    drahealth_v1_pb2,
    drahealth_v1alpha1_pb2,
    pluginregistration_v1_pb2,
)

PROTO = Path(__file__).resolve().parents[2] / "rdma_cni" / "proto"
# ours -> its path in the module k8s.io/kubelet@v0.37.2
VENDORED = {
    "dra_v1.proto": "pkg/apis/dra/v1/api.proto",
    "dra_v1beta1.proto": "pkg/apis/dra/v1beta1/api.proto",
    "drahealth_v1.proto": "pkg/apis/dra-health/v1/api.proto",
    "drahealth_v1alpha1.proto": "pkg/apis/dra-health/v1alpha1/api.proto",
    "pluginregistration_v1.proto": "pkg/apis/pluginregistration/v1/api.proto",
}


def methods(module: object) -> set[str]:
    return {f"/{s.full_name}/{m.name}" for s in module.DESCRIPTOR.services_by_name.values()  # type: ignore[attr-defined]
            for m in s.methods}


def test_method_paths_are_the_ones_kubelet_calls() -> None:
    assert methods(dra_v1_pb2) == {"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                                   "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"}
    assert methods(dra_v1beta1_pb2) == {
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"}
    assert methods(pluginregistration_v1_pb2) == {"/pluginregistration.Registration/GetInfo",
                                                  "/pluginregistration.Registration/NotifyRegistrationStatus"}
    assert methods(drahealth_v1_pb2) == {"/v1.DRAResourceHealth/NodeWatchResources"}
    assert methods(drahealth_v1alpha1_pb2) == {"/v1alpha1.DRAResourceHealth/NodeWatchResources"}
    assert dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"].number == 5


def test_vendored_protos_equal_kubelets_own() -> None:
    candidates = (os.environ.get("GO", ""), "/usr/local/go/bin/go")
    go = next((g for g in candidates if g and os.access(g, os.X_OK)), None)
    if go is None:
        pytest.skip("no Go to find the module cache with")
    modcache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
    root = Path(modcache, "k8s.io", "kubelet@v0.37.2")
    if not root.is_dir():
        pytest.skip(f"{root} not downloaded (go mod download k8s.io/kubelet@v0.37.2)")
    for ours, theirs in VENDORED.items():
        body = (PROTO / ours).read_text().split("\n\n", 1)[1]  # after our header comment
        assert body == (root / theirs).read_text(), ours
