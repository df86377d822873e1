"""The test cluster's stand-in GPU plugin (tests/cluster/gpu_plugin.py) against the simulated kubelet.

Why: the cluster's seed pod only gets NUMA-aligned GPUs and bonds if this plugin registers like a
real one, reports its GPUs' NUMA nodes, prefers one NUMA node and comes back after every kubelet
restart; a mistake here would show up as a misaligned pod in a 10-minute cluster run instead of
here in seconds. Real gRPC over unix sockets (rdma_cni/sim/kubelet.py); no root needed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cluster import gpu_plugin as gp

from rdma_cni.sim.kubelet import Dev, Endpoint, TestKubelet

REPO = Path(__file__).resolve().parent.parent
ALL = [f"gpu-{i}" for i in range(8)]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must fit in 108 bytes, pytest's tmp_path may not."""
    d = Path(tempfile.mkdtemp(prefix="gpu-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kubelet(short_dir: Path) -> Iterator[TestKubelet]:
    k = TestKubelet(short_dir / "kubelet").start()
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture
def plugin(kubelet: TestKubelet) -> Iterator[gp.GpuPlugin]:
    p = gp.GpuPlugin(gp.layout(), kubelet.dir).start()
    try:
        yield p
    finally:
        p.stop()


def numa_of(devs: list[Dev]) -> dict[str, tuple[int, ...]]:
    return {d.id: d.numa for d in devs}


# --------------------------------------------------------------------------- layout and choice


def test_layout_puts_two_gpus_and_two_bonds_on_each_root_and_two_roots_on_each_numa_node() -> None:
    gpus = gp.layout()
    assert [(g.id, g.numa, g.root) for g in gpus] == [
        ("gpu-0", 0, "pci0000:00"), ("gpu-1", 0, "pci0000:00"),
        ("gpu-2", 0, "pci0000:40"), ("gpu-3", 0, "pci0000:40"),
        ("gpu-4", 1, "pci0000:80"), ("gpu-5", 1, "pci0000:80"),
        ("gpu-6", 1, "pci0000:c0"), ("gpu-7", 1, "pci0000:c0"),
    ]
    bonds = gp.bond_layout()
    assert bonds["mlx5_bond_0"] == ("pci0000:00", 0)
    assert bonds["mlx5_bond_3"] == ("pci0000:40", 0)
    assert bonds["mlx5_bond_4"] == ("pci0000:80", 1)  # as the demo's --bonds 8: NUMA i // 4
    assert [gp.root_name(r, 2) for r in range(2)] == ["pci0000:00", "pci0000:80"]
    with pytest.raises(ValueError, match="evenly"):
        gp.layout(8, 3, 4)


@pytest.mark.parametrize(("available", "must", "size", "expected"), [
    (ALL, [], 4, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]),  # one NUMA node, two whole roots
    (ALL, ["gpu-5"], 4, ["gpu-5", "gpu-4", "gpu-6", "gpu-7"]),  # must_include's NUMA node
    (ALL, ["gpu-2"], 2, ["gpu-2", "gpu-3"]),  # must_include's root
    # NUMA 0 has only 3 left, NUMA 1 has 4: a 4-GPU request goes to NUMA 1
    (["gpu-0", "gpu-2", "gpu-3", *ALL[4:]], [], 4, ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]),
    # a whole root before two halves; then the one that breaks no whole root
    (["gpu-0", "gpu-2", "gpu-4", "gpu-5", "gpu-6", "gpu-7"], [], 2, ["gpu-4", "gpu-5"]),
    (["gpu-0", "gpu-1", "gpu-2"], [], 1, ["gpu-2"]),
    # NUMA 0 is partly taken: a 2-GPU request fills it rather than breaking NUMA 1
    (["gpu-2", "gpu-3", *ALL[4:]], [], 2, ["gpu-2", "gpu-3"]),
    (["gpu-1", "gpu-7"], [], 4, ["gpu-1", "gpu-7"]),  # more asked than offered: all of it
    (["gpu-0", "bogus", "gpu-4"], [], 1, ["gpu-0"]),  # an unknown ID sorts last, never raises
])
def test_preferred_allocation(available: list[str], must: list[str], size: int, expected: list[str]) -> None:
    assert gp.preferred(gp.layout(), available, must, size) == expected


def test_allocation_envs_name_each_gpus_root_and_numa_node_in_index_order() -> None:
    envs = gp.allocation_envs(gp.layout(), ["gpu-5", "gpu-4"])
    assert envs == {"NVIDIA_VISIBLE_DEVICES": "gpu-4,gpu-5",
                    "RDMA_CNI_TEST_GPU_PCIE_ROOTS": "pci0000:80,pci0000:80",
                    "RDMA_CNI_TEST_GPU_NUMA_NODES": "1,1"}


# --------------------------------------------------------------------------- against the kubelet


def test_registers_and_lists_eight_healthy_gpus_with_their_numa_nodes(
        kubelet: TestKubelet, plugin: gp.GpuPlugin) -> None:
    ep = kubelet.wait_endpoint(gp.RESOURCE)
    assert ep.endpoint == "nvidia-gpu.sock"
    assert ep.options.get_preferred_allocation_available
    assert not ep.options.pre_start_required
    _, devs = ep.wait_list(lambda d: len(d) == 8)
    assert numa_of(devs) == {f"gpu-{i}": (i // 4,) for i in range(8)}
    assert {d.health for d in devs} == {"Healthy"}
    assert kubelet.rejected == []


def test_preferred_allocation_of_four_picks_one_numa_node(kubelet: TestKubelet, plugin: gp.GpuPlugin) -> None:
    ep = kubelet.wait_endpoint(gp.RESOURCE)
    _, devs = ep.wait_list(lambda d: len(d) == 8)
    numa = {d.id: d.numa[0] for d in devs}
    picks = ep.preferred(ALL, [], 4)
    assert len(picks) == 4 and len({numa[p] for p in picks}) == 1, picks
    # kubelet's best-effort path after choosing NUMA 1: the aligned set plus what it already holds
    picks = ep.preferred(ALL[4:], ["gpu-6"], 2)
    assert picks == ["gpu-6", "gpu-7"]


def test_allocate_answers_the_env_and_no_device_nodes(kubelet: TestKubelet, plugin: gp.GpuPlugin) -> None:
    ep = kubelet.wait_endpoint(gp.RESOURCE)
    resp = ep.allocate(["gpu-3", "gpu-0", "gpu-1", "gpu-2"], ["gpu-7"])
    assert len(resp.container_responses) == 2
    first, second = resp.container_responses
    assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": "gpu-0,gpu-1,gpu-2,gpu-3",
                                "RDMA_CNI_TEST_GPU_PCIE_ROOTS": "pci0000:00,pci0000:00,pci0000:40,pci0000:40",
                                "RDMA_CNI_TEST_GPU_NUMA_NODES": "0,0,0,0"}
    assert dict(second.envs)["RDMA_CNI_TEST_GPU_PCIE_ROOTS"] == "pci0000:c0"
    assert not first.devices and not first.mounts and not first.cdi_devices
    with pytest.raises(grpc.RpcError) as e:
        ep.allocate(["gpu-8"])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gpu-8" in (e.value.details() or "")


def _registered_again(kubelet: TestKubelet, old: Endpoint) -> Endpoint:
    ep = kubelet.wait_endpoint(gp.RESOURCE, newer_than=old, timeout=10)
    _, devs = ep.wait_list(lambda d: len(d) == 8)
    assert numa_of(devs)["gpu-7"] == (1,)
    return ep


def test_registers_again_after_a_kubelet_restart(kubelet: TestKubelet, plugin: gp.GpuPlugin) -> None:
    first = kubelet.wait_endpoint(gp.RESOURCE)
    first.wait_list(lambda d: len(d) == 8)
    started = time.monotonic()
    kubelet.restart()  # deletes every socket in the directory, re-creates kubelet.sock
    ep = _registered_again(kubelet, first)
    assert time.monotonic() - started < 5
    assert plugin.registrations == 2
    assert ep.allocate(["gpu-1"]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "gpu-1"
    kubelet.restart()
    _registered_again(kubelet, ep)
    assert kubelet.rejected == []


def test_registers_again_when_its_socket_is_deleted(kubelet: TestKubelet, plugin: gp.GpuPlugin) -> None:
    first = kubelet.wait_endpoint(gp.RESOURCE)
    first.wait_list(lambda d: len(d) == 8)
    os.unlink(plugin.socket_path)
    _registered_again(kubelet, first)
    assert os.path.exists(plugin.socket_path)


def test_waits_for_a_kubelet_that_starts_later(short_dir: Path) -> None:
    kubelet = TestKubelet(short_dir / "kubelet")
    os.makedirs(kubelet.dir)
    plugin = gp.GpuPlugin(gp.layout(), kubelet.dir).start()
    try:
        time.sleep(0.5)
        assert plugin.registrations == 0
        kubelet.start()  # its cleanup deletes the plugin's socket too, as a real kubelet's would
        kubelet.wait_endpoint(gp.RESOURCE, timeout=10).wait_list(lambda d: len(d) == 8)
    finally:
        plugin.stop()
        kubelet.stop()


def test_cli_serves_registers_and_ends_cleanly_on_sigterm(kubelet: TestKubelet) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cluster.gpu_plugin", "--device-plugin-dir", kubelet.dir,
         "--count", "4", "--numa-nodes", "2", "--roots", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ep = kubelet.wait_endpoint(gp.RESOURCE, timeout=20)
        _, devs = ep.wait_list(lambda d: len(d) == 4)
        assert numa_of(devs) == {"gpu-0": (0,), "gpu-1": (0,), "gpu-2": (1,), "gpu-3": (1,)}
        env_roots = ep.allocate(["gpu-2"]).container_responses[0].envs["RDMA_CNI_TEST_GPU_PCIE_ROOTS"]
        assert env_roots == "pci0000:80"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "registered nvidia.com/gpu" in err and "SIGTERM" in err
        assert not os.path.exists(os.path.join(kubelet.dir, "nvidia-gpu.sock"))
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
