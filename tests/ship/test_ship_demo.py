"""The demo (scripts/demo) end to end: it must succeed, show what it promises, and leave nothing
behind — also when interrupted (Ctrl-C) or killed (the next run sweeps what a dead run left)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = [str(REPO / "scripts" / "demo")]

pytestmark = pytest.mark.netns


def _skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("the demo needs root")
    if not any(os.access(f"{d}/ptp", os.X_OK) for d in ("/usr/lib/cni", "/opt/cni/bin")):
        pytest.skip("reference CNI plugins missing (scripts/setup installs containernetworking-plugins)")


def leftovers(pid: int) -> list[str]:
    """Namespaces and temp dirs of the demo run whose python process had ``pid``."""
    tag = f"h6-demo-{pid}-"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    found = [line.split()[0] for line in names.splitlines() if line.startswith(tag)]
    return found + [str(p) for p in Path("/tmp").glob(f"{tag}*")]


def demo_pid(proc: subprocess.Popen[str]) -> int:
    """scripts/demo is bash running python: the python child's pid is the one in the names."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return int(children[0]) if children else proc.pid


def start() -> subprocess.Popen[str]:
    return subprocess.Popen(
        DEMO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=REPO,
        preexec_fn=_as_from_a_terminal,
    )


def read_until(proc: subprocess.Popen[str], marker: str, timeout: float = 120) -> str:
    assert proc.stdout is not None
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        if marker in line:
            return "".join(out)
    raise AssertionError(f"demo never printed {marker!r}:\n{''.join(out)[-3000:]}")


def test_demo_shows_the_pod_the_gids_the_ping_and_restores_the_node() -> None:
    _skip_unless_possible()
    proc = start()
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-5000:]
    for expected in (
        "mlx5_bond_0  1     3      0000:0000:0000:0000:0000:ffff:c633:6402  198.51.100.2   v2   bond0",
        "-> the host's RoCE v2 GID index for bond0's IPv4 address is 3",
        "bond0@if",  # the pod's interfaces are named like the bonds (podIfName: master)
        "198.51.100.2/28",
        "from 198.51.100.18 lookup 101",  # per-bond routing table for the second bond
        "-> pod bond1: RoCE v2 GID of 198.51.100.18 at index 3, the same as the host's",
        "pod bond0 -> 198.51.100.1: reply in",
        "pod bond1 -> 198.51.100.17: reply in",
        "OK   gid-index-unified",
        "0 warnings, 0 failures",
        "-> node restored",
        # the device plugin: registered, capacity, NUMA, the pod's allocation, a clean stop
        "kubelet: registered tke.cloud.tencent.com/tke-shared-rdma from tke-shared-rdma-",
        "-> node capacity tke.cloud.tencent.com/tke-shared-rdma: 4, allocatable: 4",
        "mlx5_bond_3  Healthy   NUMA node 1",
        "GetPreferredAllocation -> mlx5_bond_0, mlx5_bond_1",
        "/dev/infiniband/uverbs1    <- ",
        "NCCL_IB_HCA==mlx5_bond_0,mlx5_bond_1",
        "NCCL_IB_GID_INDEX=3",
        "kubelet PodResources: the pod holds mlx5_bond_0, mlx5_bond_1",
        "-> kubelet's PodResources API was asked (Get, List, GetAllocatableResources) which devices the "
        "pod holds",
        "OK   device-plugin mlx5_bond_0      bond0, NUMA 0, healthy",
        "rdma-device-plugin stopped (SIGTERM, exit code 0): its socket removed",
        "demo OK",
    ):
        assert expected in out, f"missing {expected!r} in:\n{out[-6000:]}"
    pid = int(out.split("h6-demo-")[1].split("-")[0])
    assert leftovers(pid) == []


def test_ctrl_c_in_the_middle_removes_everything() -> None:
    _skip_unless_possible()
    proc = start()
    try:
        read_until(proc, "=== 3.")
        pid = demo_pid(proc)
        assert leftovers(pid), "the demo's namespaces should exist while it runs"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, rest
    assert "demo interrupted" in rest and "cleaned up" in rest
    assert leftovers(pid) == []


def _set_subreaper(on: bool) -> None:
    """PR_SET_CHILD_SUBREAPER: orphans of our descendants become our children, not PID 1's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _group(pgid: int) -> list[int]:
    """Pids of the processes in process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                found.append(int(entry.name))
    return found


def test_a_killed_run_is_swept_by_the_next_one() -> None:
    """The killed run's python is kept a zombie (unreaped, /proc entry present) while the next run
    sweeps: as when PID 1 reaps orphans late. The sweep must still treat it as dead."""
    _skip_unless_possible()
    _set_subreaper(True)  # the orphaned python becomes our child: we decide when it is reaped
    orphans: list[int] = []
    try:
        proc = start()
        try:
            read_until(proc, "=== 3.")
            pid = demo_pid(proc)
        finally:
            orphans = [p for p in _group(proc.pid) if p != proc.pid]
            # bash first: reaped by us, so it cannot reap python as it dies; python, now our child,
            # then stays a zombie until we reap it
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            os.killpg(proc.pid, signal.SIGKILL)  # no chance to clean up
        assert leftovers(pid), "a kill -9 leaves the namespaces behind"
        assert pid in orphans
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed demo never became a zombie"
            time.sleep(0.01)
        again = subprocess.run(DEMO, capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
        assert os.path.exists(f"/proc/{pid}"), "still a zombie during the second run"
        assert again.returncode == 0, again.stdout[-3000:]
        assert leftovers(pid) == []
    finally:
        _set_subreaper(False)
        for orphan in orphans:  # reap exactly the killed run's processes, nothing else of ours
            with contextlib.suppress(ChildProcessError):
                os.waitpid(orphan, 0)


def test_a_zombie_or_missing_pid_counts_as_dead_a_running_one_as_alive() -> None:
    """The sweep's liveness test on real processes: a child that exited but is not reaped yet
    (state Z, /proc entry still there) is dead; so is a pid that no longer exists."""
    from rdma_cni.cli.demo.shell import process_alive

    child = subprocess.Popen(["sleep", "30"])
    try:
        assert process_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.01)
        assert os.path.exists(f"/proc/{child.pid}")  # not reaped: exactly what the sweep meets
        assert not process_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid)
    assert process_alive(os.getpid())


def _as_from_a_terminal() -> None:
    """The demo's SIGINT as a terminal's foreground job has it (default): a suite started by a
    shell's ``cmd &`` inherits SIGINT ignored, passed it on, and the Ctrl-C below went unheard."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
