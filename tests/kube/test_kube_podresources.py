"""The PodResources client against a test kubelet speaking the real v1 API over a real unix socket:
Get where kubelet offers it, List on kubelets without it (absent or gate off), an absent socket, a
socket nobody serves, an answer that is not protobuf, and grpc kept out of a plain import."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdma_cni.cni.errors import KUBE_API_FAILURE, CniError
from rdma_cni.kube import podresources
from tests.podresources_server import PodResourcesServer

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def short_dir() -> Iterator[str]:
    """A unix socket path must fit in 108 bytes: pytest's tmp_path may not."""
    d = tempfile.mkdtemp(prefix="h11c-pr-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def serve(d: str, **kw: object) -> PodResourcesServer:
    server = PodResourcesServer(podresources.socket_path(d), **kw)  # type: ignore[arg-type]
    server.set_pod("default", "ibv-app-0", {
        "init": {RESOURCE: ["mlx5_bond_6"]},
        "trainer": {RESOURCE: ["mlx5_bond_1", "mlx5_bond_3", "mlx5_bond_6"], "nvidia.com/gpu": ["GPU-a"]},
    })  # fmt: skip
    server.set_pod("default", "other", {"c": {RESOURCE: ["mlx5_bond_0"]}})
    server.set_pod("kube-system", "ibv-app-0", {"c": {}})
    return server


EXPECTED = {RESOURCE: ["mlx5_bond_6", "mlx5_bond_1", "mlx5_bond_3"], "nvidia.com/gpu": ["GPU-a"]}


def test_get_answers_one_pod_with_every_containers_devices_once(short_dir: str) -> None:
    with serve(short_dir) as kubelet:
        got = podresources.pod_devices(kubelet.socket, "default", "ibv-app-0")
        assert got == EXPECTED
        assert kubelet.calls == ["Get"]
        assert podresources.pod_devices(kubelet.socket, "kube-system", "ibv-app-0") == {}


@pytest.mark.parametrize("get", ["absent", "disabled"])
def test_kubelet_without_get_is_asked_with_list(short_dir: str, get: str) -> None:
    with serve(short_dir, get=get) as kubelet:
        assert podresources.pod_devices(kubelet.socket, "default", "ibv-app-0") == EXPECTED
        assert kubelet.calls == (["List"] if get == "absent" else ["Get", "List"])  # absent: never reached
        assert podresources.pod_devices(kubelet.socket, "default", "nobody") is None


def test_a_pod_get_does_not_know_is_looked_up_in_list_and_is_none_there_too(short_dir: str) -> None:
    with serve(short_dir) as kubelet:
        assert podresources.pod_devices(kubelet.socket, "default", "nobody") is None
        assert kubelet.calls == ["Get", "List"]


def test_list_pods_and_allocatable_with_numa(short_dir: str) -> None:
    with serve(short_dir) as kubelet:
        kubelet.set_allocatable(RESOURCE, {"mlx5_bond_0": 0, "mlx5_bond_1": 1, "mlx5_bond_9": None})
        pods = podresources.list_pods(kubelet.socket)
        assert pods[("default", "other")] == {RESOURCE: ["mlx5_bond_0"]}
        assert pods[("default", "ibv-app-0")] == EXPECTED and pods[("kube-system", "ibv-app-0")] == {}
        got = podresources.allocatable(kubelet.socket)
        assert got == [podresources.Allocatable(RESOURCE, "mlx5_bond_0", (0,)),
                       podresources.Allocatable(RESOURCE, "mlx5_bond_1", (1,)),
                       podresources.Allocatable(RESOURCE, "mlx5_bond_9", ())]  # fmt: skip


def test_no_socket_means_no_pod_resources_not_an_error(short_dir: str) -> None:
    sock = podresources.socket_path(short_dir)
    assert podresources.pod_devices(sock, "default", "ibv-app-0") is None
    os.mkdir(sock)  # a directory where the socket should be (a wrong hostPath mount) is no socket either
    assert podresources.pod_devices(sock, "default", "ibv-app-0") is None


def test_a_socket_nobody_serves_is_a_clear_error(short_dir: str) -> None:
    sock = podresources.socket_path(short_dir)
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)  # bound, never listening: what a kubelet that died leaves behind
    s.close()
    with pytest.raises(CniError) as err:
        podresources.pod_devices(sock, "default", "ibv-app-0", timeout=2)
    assert err.value.code == KUBE_API_FAILURE
    assert sock in err.value.msg and "kubelet running" in err.value.msg and "podResourcesDir" in err.value.msg


def test_a_socket_that_never_answers_times_out(short_dir: str) -> None:
    sock = podresources.socket_path(short_dir)
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    s.listen(8)  # accepts the connection, never speaks HTTP/2
    try:
        with pytest.raises(CniError) as err:
            podresources.list_pods(sock, timeout=0.5)
    finally:
        s.close()
    assert err.value.code == KUBE_API_FAILURE and sock in err.value.msg, err.value.msg
    assert "0.5 s" in err.value.msg or "nothing answers" in err.value.msg, err.value.msg


def test_an_answer_that_is_not_protobuf_is_a_clear_error(short_dir: str) -> None:
    with serve(short_dir, malformed=True) as kubelet:
        with pytest.raises(CniError) as err:
            podresources.list_pods(kubelet.socket)
    assert err.value.code == KUBE_API_FAILURE
    assert "not a PodResources v1 message" in err.value.msg, err.value.msg


def test_importing_the_client_or_multus_loads_no_grpc() -> None:
    """rdma-agent imports every plugin before it forks its workers: grpc must not come with them."""
    code = (
        "import sys, json\n"
        "import rdma_cni.kube.podresources, rdma_cni.plugins.multus.plugin, rdma_cni.cli.multus\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": REPO})  # fmt: skip
    assert json.loads(proc.stdout) == []


def test_a_call_leaves_no_thread_and_no_descriptor(short_dir: str) -> None:
    """An rdma-agent worker serves more calls only when a call left nothing behind, and setns into
    the next caller's mount namespace needs a single-threaded process: gRPC must leave neither."""
    code = (
        "import os, sys, json\n"
        "def seen(): return len(os.listdir('/proc/self/task')), len(os.listdir('/proc/self/fd'))\n"
        "before = seen()\n"
        "from rdma_cni.kube import podresources\n"
        "got = podresources.pod_devices(sys.argv[1], 'default', 'ibv-app-0')\n"
        "podresources.list_pods(sys.argv[1])\n"
        "print(json.dumps({'before': before, 'after': seen(), 'got': got}))"
    )
    with serve(short_dir) as kubelet:
        proc = subprocess.run([sys.executable, "-c", code, kubelet.socket], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONPATH": REPO})  # fmt: skip
    out = json.loads(proc.stdout)
    assert out["got"] == EXPECTED
    assert out["after"] == out["before"] == [1, out["before"][1]], out
