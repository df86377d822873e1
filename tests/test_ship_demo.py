"""The demo (scripts/demo) end to end: it must succeed, show what it promises, and leave nothing
behind — also when interrupted (Ctrl-C) or killed (the next run sweeps what a dead run left)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
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
        DEMO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=REPO
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


def test_a_killed_run_is_swept_by_the_next_one() -> None:
    _skip_unless_possible()
    proc = start()
    try:
        read_until(proc, "=== 3.")
        pid = demo_pid(proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no chance to clean up
        proc.wait()
    assert leftovers(pid), "a kill -9 leaves the namespaces behind"
    # The python child is reparented to PID 1, which may reap it a second later (this sandbox's init
    # does): until then it is a zombie with a /proc entry, and the sweep rightly keeps a live pid's
    # namespaces. Wait for it, as a next run after a real kill -9 would find it gone.
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    again = subprocess.run(DEMO, capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert again.returncode == 0, again.stdout[-3000:]
    assert leftovers(pid) == []
