"""``scripts/cluster up`` cut short: killed with -9 its leftovers are swept by the next ``up``, and a
SIGTERM makes it remove what it made itself. Each is cut as soon as it has made every kind of thing
``down`` removes: a process (the simulated node's), network and mount namespaces, mounts, cgroups,
files; later steps only add more of the same kinds. One test does both: the ``up`` that sweeps the
killed run is the one then stopped by SIGTERM (a whole second ``up`` was 35 s of the suite's wall
time and showed nothing more about the sweep).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import cluster, procs
from cluster import topology as topo
from cluster.cluster import State
from cluster.node import NS_DIR, RUN, WORK

pytestmark = [pytest.mark.cluster, pytest.mark.netns]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_cluster() -> Iterator[None]:
    """This test owns the machine's one cluster; whatever it leaves is removed."""
    with cluster.exclusive():
        cluster.down()
        try:
            yield
        finally:
            cluster.down()


def start_up() -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}:{REPO}")
    return subprocess.Popen([sys.executable, "-m", "cluster.main", "up"], env=env, stdin=subprocess.DEVNULL)


def wait_for_every_kind(up: subprocess.Popen[bytes], after: State | None = None) -> State:
    """The run's state once it holds every kind; ``after``: a killed run whose state file is still
    there, so only a state of other processes counts."""
    old = {(p.pid, p.start) for p in after.procs} if after else set()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        st = State.load()
        mine = not {(p.pid, p.start) for p in st.procs} & old
        if mine and st.procs and st.cgroups and st.mntns and st.netns:
            return st
        assert up.poll() is None, f"up ended early ({up.returncode})"
        time.sleep(0.05)
    raise AssertionError("up did not get that far within 300 s")


def leftovers(st: State) -> list[str]:
    """What of ``st``'s run is still on the machine."""
    out = [f"process {p.name} ({p.pid})" for p in st.procs if procs.alive(p)]
    out += [f"netns {n}" for n in topo.leftover_netns()]
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    out += [f"mount {m}" for m in mounts if m.startswith((str(WORK), str(NS_DIR)))]
    out += [f"cgroup {c}" for c in st.cgroups if os.path.exists(c)]
    out += [f"dir {d}" for d in (WORK, RUN) if d.exists()]
    return out


def test_an_up_killed_with_9_is_swept_by_the_next_up_and_a_sigterm_removes_what_that_one_made(
    no_cluster: None,
) -> None:
    up = start_up()
    killed = wait_for_every_kind(up)
    up.kill()
    up.wait()
    assert leftovers(killed), "a run killed with -9 leaves its components running"
    again = start_up()
    made = wait_for_every_kind(again, after=killed)
    alive = [p for p in killed.procs if procs.alive(p)]
    assert alive == [], "the next up ended every process of the killed run"
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=120) != 0
    assert leftovers(made) == [] and leftovers(killed) == []
