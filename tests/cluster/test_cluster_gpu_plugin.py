"""The test cluster's stand-in GPU plugin (tests/cluster/gpu_plugin.py) against the simulated kubelet.

Why: the cluster's seed pod only gets NUMA-aligned GPUs and bonds if this plugin registers like a
real one, reports its GPUs' NUMA nodes, prefers one NUMA node and comes back after every kubelet
restart; a mistake here would show up as a misaligned pod in a 10-minute cluster run instead of
here in seconds. Real gRPC over unix sockets (rdma_cni/sim/kubelet.py); no root needed.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cluster import gpu_plugin as gp
from cluster import numa_tree as nt
from cluster.topology import bond_numa
from rdma_cni.sim import tree as sim_tree
from rdma_cni.sim.kubelet import Dev, Endpoint, TestKubelet

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "cluster" / "numa_probe"
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
        ("gpu-0", 0, "pci0000:00"),
        ("gpu-1", 0, "pci0000:00"),
        ("gpu-2", 0, "pci0000:20"),
        ("gpu-3", 0, "pci0000:20"),
        ("gpu-4", 1, "pci0000:40"),
        ("gpu-5", 1, "pci0000:40"),
        ("gpu-6", 1, "pci0000:60"),
        ("gpu-7", 1, "pci0000:60"),
    ]
    bonds = gp.bond_layout()
    # GPU i and bond i share root and NUMA node; the bonds' roots are the simulated sysfs's
    assert bonds == {f"mlx5_bond_{g.index}": (g.root, g.numa) for g in gpus}
    assert [sim_tree.pcie_root(i) for i in range(8)] == [g.root for g in gpus]
    assert [bond_numa(b) for b in range(8)] == [g.numa for g in gpus]  # the cluster's bonds
    assert [g.root for g in gp.layout(4, 2, 2)] == ["pci0000:00", "pci0000:00", "pci0000:20", "pci0000:20"]
    with pytest.raises(ValueError, match="evenly"):
        gp.layout(8, 3, 4)
    with pytest.raises(ValueError, match="roots"):
        gp.layout(16, 2, 16)


@pytest.mark.parametrize(
    ("available", "must", "size", "expected"),
    [
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
    ],
)
def test_preferred_allocation(available: list[str], must: list[str], size: int, expected: list[str]) -> None:
    assert gp.preferred(gp.layout(), available, must, size) == expected


def test_allocation_envs_name_each_gpus_root_and_numa_node_in_index_order() -> None:
    envs = gp.allocation_envs(gp.layout(), ["gpu-5", "gpu-4"])
    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": "gpu-4,gpu-5",
        "RDMA_CNI_TEST_GPU_PCIE_ROOTS": "pci0000:40,pci0000:40",
        "RDMA_CNI_TEST_GPU_NUMA_NODES": "1,1",
    }


# --------------------------------------------------------------------------- against the kubelet


def test_registers_and_lists_eight_healthy_gpus_with_their_numa_nodes(
    kubelet: TestKubelet, plugin: gp.GpuPlugin
) -> None:
    ep = kubelet.wait_endpoint(gp.RESOURCE)
    assert re.fullmatch(r"nvidia-gpu-\d+\.sock", ep.endpoint), ep.endpoint
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
    assert dict(first.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "gpu-0,gpu-1,gpu-2,gpu-3",
        "RDMA_CNI_TEST_GPU_PCIE_ROOTS": "pci0000:00,pci0000:00,pci0000:20,pci0000:20",
        "RDMA_CNI_TEST_GPU_NUMA_NODES": "0,0,0,0",
    }
    assert dict(second.envs)["RDMA_CNI_TEST_GPU_PCIE_ROOTS"] == "pci0000:60"
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
    deadline = time.monotonic() + 5  # kubelet takes the endpoint before Register returns to us
    while plugin.registrations < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert plugin.registrations == 2
    assert ep.allocate(["gpu-1"]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "gpu-1"
    kubelet.restart()
    _registered_again(kubelet, ep)
    assert kubelet.rejected == []


def test_registers_again_when_its_socket_is_deleted(kubelet: TestKubelet, plugin: gp.GpuPlugin) -> None:
    first = kubelet.wait_endpoint(gp.RESOURCE)
    first.wait_list(lambda d: len(d) == 8)
    path = plugin.socket_path
    assert path is not None
    os.unlink(path)
    ep = _registered_again(kubelet, first)
    assert plugin.socket_path == os.path.join(kubelet.dir, ep.endpoint) != path
    assert os.path.exists(os.path.join(kubelet.dir, ep.endpoint))


def test_removes_a_killed_runs_socket_and_keeps_a_live_ones(kubelet: TestKubelet) -> None:
    stale = os.path.join(kubelet.dir, "nvidia-gpu-1.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(stale)  # bound, never listened on: what a kill -9 leaves
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live_path = os.path.join(kubelet.dir, "nvidia-gpu-2.sock")
    live.bind(live_path)
    live.listen()
    plugin = gp.GpuPlugin(gp.layout(), kubelet.dir).start()
    try:
        kubelet.wait_endpoint(gp.RESOURCE)
        assert not os.path.exists(stale)
        assert os.path.exists(live_path)
    finally:
        plugin.stop()
        live.close()


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
        [
            sys.executable,
            "-m",
            "cluster.gpu_plugin",
            "--device-plugin-dir",
            kubelet.dir,
            "--count",
            "4",
            "--numa-nodes",
            "2",
            "--roots",
            "2",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ep = kubelet.wait_endpoint(gp.RESOURCE, timeout=20)
        _, devs = ep.wait_list(lambda d: len(d) == 4)
        assert numa_of(devs) == {"gpu-0": (0,), "gpu-1": (0,), "gpu-2": (1,), "gpu-3": (1,)}
        env_roots = ep.allocate(["gpu-2"]).container_responses[0].envs["RDMA_CNI_TEST_GPU_PCIE_ROOTS"]
        assert env_roots == "pci0000:20"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "registered nvidia.com/gpu" in err and "SIGTERM" in err
        assert not os.path.exists(os.path.join(kubelet.dir, ep.endpoint))
        assert os.listdir(kubelet.dir) == ["kubelet.sock"]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


# --------------------------------------------------------------------------- the fake NUMA tree
# kubelet aligns GPUs and bonds only over the NUMA nodes cadvisor reports; the cluster's nodes get
# a tree from tests/cluster/numa_tree.py over /sys/devices/system/node. First its formats against
# the real kernel's and cadvisor's reading rules in Python, then cadvisor's own Go code on it.

CADVISOR_NODE_ID = re.compile(r"node/node(\d*)")  # utils/sysinfo nodeDirRegExp
CADVISOR_MEMTOTAL = re.compile(r"MemTotal:\s*([0-9]+) kB")  # utils/sysinfo memoryCapacityRegexp


def test_kernel_formats() -> None:
    assert nt.format_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert nt.format_list([]) == ""
    assert nt.parse_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert nt.format_mask([0, 1], 2) == "3"
    assert nt.format_mask([1], 2) == "2"
    assert nt.format_mask(range(36), 36) == "f,ffffffff"
    assert nt.format_mask([33], 64) == "00000002,00000000"
    assert nt.format_mask([0], 8) == "01"
    assert nt.split_evenly(7, 2) == [4, 3]
    assert nt.split_cpus([0, 1], 2) == [[0], [1]]
    assert nt.split_cpus([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3, 4]]
    assert nt.distance_row(1, 3) == "20 10 20\n"
    text = "Node 0 MemTotal:       17262328 kB\nNode 0 HugePages_Total:     3\n"
    assert nt.split_meminfo(text, 2) == [
        "Node 0 MemTotal:        8631164 kB\nNode 0 HugePages_Total:     2\n",
        "Node 1 MemTotal:        8631164 kB\nNode 1 HugePages_Total:     1\n",
    ]


def _copy_sysfs_nodes(dest: Path) -> Path:
    """A still copy of the real /sys/devices/system/node (readable files only): the real memory
    figures move while a test runs; the tree must split exactly what it read."""
    for dirpath, _dirs, files in os.walk(nt.SYS_NODE):
        rel = Path(dirpath).relative_to(nt.SYS_NODE)
        if "power" in rel.parts:
            continue
        for f in files:
            src = Path(dirpath) / f
            if src.is_symlink():
                continue
            try:
                text = src.read_text()
            except OSError:
                continue
            (dest / rel).mkdir(parents=True, exist_ok=True)
            (dest / rel / f).write_text(text)
    return dest


@pytest.fixture
def real_copy(short_dir: Path) -> Path:
    if len(list(nt.SYS_NODE.glob("node*[0-9]"))) != 1:
        pytest.skip("this machine has more than one NUMA node: nothing to fake")
    return _copy_sysfs_nodes(short_dir / "sysnode")


def test_a_one_node_tree_is_the_real_node_byte_for_byte(real_copy: Path, short_dir: Path) -> None:
    """nodes=1 writes what the kernel shows: the formats are the kernel's, not look-alikes."""
    tree = nt.build_numa_tree(short_dir / "one", 1, source=real_copy)
    for rel in (
        "node0/cpulist",
        "node0/cpumap",
        "node0/distance",
        "node0/meminfo",
        "node0/numastat",
        "node0/vmstat",
        *nt.NODE_LISTS,
    ):
        if (real_copy / rel).exists():
            assert (tree / rel).read_text() == (real_copy / rel).read_text(), rel
    for f in (real_copy / "node0" / "hugepages").glob("*/*"):
        assert (tree / "node0" / "hugepages" / f.parent.name / f.name).read_text() == f.read_text()
    assert sorted(p.name for p in (tree / "node0").glob("cpu*[0-9]")) == sorted(
        p.name for p in (nt.SYS_NODE / "node0").glob("cpu*[0-9]")
    )


def test_a_two_node_tree_read_by_cadvisors_rules(real_copy: Path, short_dir: Path) -> None:
    """cadvisor's GetNodesInfo, step by step in Python (utils/sysinfo, utils/sysfs of v0.60.5)."""
    tree = nt.build_numa_tree(short_dir / "two", 2, source=real_copy)
    assert tree.name == "node"
    real_total = int(CADVISOR_MEMTOTAL.findall((real_copy / "node0" / "meminfo").read_text())[0])
    nodes = {}
    for d in sorted(glob.glob(f"{tree}/node*[0-9]")):  # GetNodesPaths
        node_id = int(CADVISOR_NODE_ID.findall(d)[0])
        cpus = []
        for c in sorted(glob.glob(f"{d}/cpu*[0-9]")):  # GetCPUsPaths(nodeDir)
            int(Path(c, "topology", "core_id").read_text())  # GetCoreID, through the link
            int(Path(c, "topology", "physical_package_id").read_text())
            cpus.append(int(re.findall(r"/cpu(\d+)", c)[-1]))
        mem = int(CADVISOR_MEMTOTAL.findall(Path(d, "meminfo").read_text())[0])
        distances = [int(x) for x in Path(d, "distance").read_text().strip().split(" ")]
        pages = {p.name: int((p / "nr_hugepages").read_text()) for p in Path(d, "hugepages").iterdir()}
        assert all(re.fullmatch(r"hugepages-\d+kB", name) for name in pages)
        nodes[node_id] = (cpus, mem, distances)
    real_cpus = nt.parse_list((real_copy / "node0" / "cpulist").read_text())
    assert sorted(nodes) == [0, 1]
    assert sorted(c for cpus, _, _ in nodes.values() for c in cpus) == real_cpus
    assert all(len(cpus) == len(real_cpus) // 2 for cpus, _, _ in nodes.values())
    assert nodes[0][2] == [10, 20] and nodes[1][2] == [20, 10]
    assert sum(mem for _, mem, _ in nodes.values()) == real_total
    assert (tree / "has_cpu").read_text() == "0-1\n"
    assert (tree / "node1" / "cpumap").read_text() == nt.format_mask(nodes[1][0], nt.nr_cpu_ids()) + "\n"
    assert (tree / "node1" / "meminfo").read_text().startswith("Node 1 MemTotal:")


def test_a_four_cpu_machine_on_two_nodes(short_dir: Path) -> None:
    """CPUs split in contiguous blocks; the links point into the given cpu directory."""
    cpu_dir, source = short_dir / "cpu", short_dir / "node"
    (cpu_dir).mkdir()
    (cpu_dir / "possible").write_text("0-3\n")
    (source / "node0").mkdir(parents=True)
    (source / "node0" / "cpulist").write_text("0-3\n")
    (source / "node0" / "distance").write_text("10\n")
    (source / "node0" / "meminfo").write_text("Node 0 MemTotal:        1000001 kB\n")
    (source / "has_cpu").write_text("0\n")
    tree = nt.build_numa_tree(short_dir / "out", 2, source=source, cpu_dir=cpu_dir)
    assert os.readlink(tree / "node1" / "cpu2") == str(cpu_dir / "cpu2")
    assert sorted(p.name for p in (tree / "node1").glob("cpu*")) == ["cpu2", "cpu3", "cpulist", "cpumap"]
    assert (tree / "node0" / "cpumap").read_text() == "3\n"
    assert (tree / "node1" / "cpumap").read_text() == "c\n"
    assert (tree / "node0" / "meminfo").read_text() == "Node 0 MemTotal:         500001 kB\n"
    nt.build_numa_tree(short_dir / "out", 3, source=source, cpu_dir=cpu_dir)  # replaces the old one
    assert (tree / "node2" / "cpulist").read_text() == "2-3\n"
    with pytest.raises(ValueError, match="exactly one"):
        nt.build_numa_tree(short_dir / "bad", 2, source=tree, cpu_dir=cpu_dir)


@pytest.fixture(scope="module")
def numa_probe(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Any]]:
    """tests/cluster/numa_probe built once: cadvisor v0.60.5's machine.GetTopology as JSON. Given a
    tree, a build linked to read it where it lies; given None, the plain build (real paths)."""
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain (scripts/setup installs it for the cluster tests)")
    out = tmp_path_factory.mktemp("probe")
    builds: dict[Path | None, Path] = {}

    def run(tree: Path | None, *wrap: str) -> dict[str, Any]:
        if tree not in builds:
            exe = out / f"probe{len(builds)}"
            flags = (
                []
                if tree is None
                else ["-ldflags", f"-X github.com/google/cadvisor/lib/utils/sysfs.nodeDir={tree}/"]
            )
            subprocess.run(
                ["go", "build", *flags, "-o", str(exe), "."],
                cwd=PROBE,
                check=True,
                capture_output=True,
                timeout=900,
            )
            builds[tree] = exe
        proc = subprocess.run([*wrap, str(builds[tree])], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        result: dict[str, Any] = json.loads(proc.stdout)
        return result

    return run


def _topology(result: dict[str, Any]) -> dict[int, tuple[list[int], int, list[int]]]:
    return {
        n["node_id"]: ([t for c in n["cores"] for t in c["thread_ids"]], n["memory"], n["distances"])
        for n in result["nodes"]
    }


@pytest.mark.cluster
def test_cadvisor_reads_two_numa_nodes_with_one_cpu_each_from_the_tree(
    numa_probe: Callable[..., dict[str, Any]], short_dir: Path
) -> None:
    if nt.parse_list(nt.SYS_CPU.joinpath("online").read_text()) != [0, 1]:
        pytest.skip("written for this 2-CPU machine")
    tree = nt.build_numa_tree(short_dir / "numa")
    result = numa_probe(tree)
    topo = _topology(result)
    assert sorted(topo) == [0, 1], result
    assert topo[0][0] == [0] and topo[1][0] == [1]
    assert topo[0][2] == [10, 20] and topo[1][2] == [20, 10]
    assert topo[0][1] > 0 and abs(topo[0][1] - topo[1][1]) <= 1024
    assert result["num_cores"] == 2


@pytest.mark.cluster
def test_cadvisor_sees_the_tree_bind_mounted_over_sysfs_in_a_private_mount_namespace(
    numa_probe: Callable[..., dict[str, Any]], short_dir: Path
) -> None:
    """What a cluster node does: the same tree over the real path, cadvisor's real paths unchanged."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1)")
    if nt.parse_list(nt.SYS_CPU.joinpath("online").read_text()) != [0, 1]:
        pytest.skip("written for this 2-CPU machine")
    before = sorted(os.listdir(nt.SYS_NODE))
    tree = nt.build_numa_tree(short_dir / "numa")
    mount = " ".join(nt.bind_mount_args(tree))
    # unshare -m: a private mount namespace (propagation private) that dies with the probe
    result = numa_probe(None, "unshare", "-m", "sh", "-c", f'{mount} && exec "$0"')
    topo = _topology(result)
    assert sorted(topo) == [0, 1], result
    assert topo[0][0] == [0] and topo[1][0] == [1]
    assert sorted(os.listdir(nt.SYS_NODE)) == before  # the host never saw the mount
    plain = _topology(numa_probe(None))
    assert sorted(plain) == [0] and plain[0][0] == [0, 1]  # and without it, the real one node
