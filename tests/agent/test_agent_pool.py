"""rdma-agent's worker pool, served the probe plugin of ``test_agent_probe``
(``tests/probe_agent.py``): when workers are forked and when a call waits for one, workers that
serve several calls one after another, bursts and the surplus workers trimmed after them, and the
memory the pool holds.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import probe_agent
import pytest
from netns import children_of
from netns import stop_agent as stop
from probe_agent import (
    cni_env,
    forward_in_thread,
    is_zombie,
    live_children,
    new_netns,
    probe_conf,
    read_json,
    start_agent,
    wait_for_children,
)

from rdma_cni.agent import client

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]

# Network namespaces made on demand and deleted afterwards (tests/probe_agent.py).
netns = probe_agent.netns


# --- forking: when a call waits and when a worker is made for it ---------------------------------


def test_while_calls_run_no_spare_is_forked_and_a_call_finding_all_busy_waits_then_gets_one(
    tmp_path: Path,
) -> None:
    """While calls run the agent forks no spare (its fork and a fresh worker's faults would take the
    CPUs the running calls need): a call that finds every worker busy waits --queue-wait for one to
    come back, then one more worker is forked for it; after the calls, PREFORK idle again."""
    running = start_agent(tmp_path, "--queue-wait", "1.5", "--trim-after", "0.5")
    # the two calls hold their workers until the third call was answered, however slow the machine
    # (6 s of sleep ran out under load before the third call had waited)
    release = tmp_path / "release"
    try:
        idle = wait_for_children(running.pid, 2)
        started1, started2 = tmp_path / "started1.json", tmp_path / "started2.json"
        slow1 = probe_conf(holdFile=str(release), startedFile=str(started1))
        slow2 = probe_conf(holdFile=str(release), startedFile=str(started2))
        first, box1 = forward_in_thread(running.sock, cni_env("ADD"), slow1)
        busy1 = int(str(read_json(started1)["pid"]))
        second, box2 = forward_in_thread(running.sock, cni_env("DEL"), slow2)
        busy2 = int(str(read_json(started2)["pid"]))
        assert {busy1, busy2} == idle
        deadline = time.monotonic() + 1.0  # the old refill forked a spare within milliseconds
        while time.monotonic() < deadline:
            assert live_children(running.pid) == idle, "a spare worker was forked while calls ran"
            time.sleep(0.01)
        marker = tmp_path / "third.json"
        t0 = time.monotonic()
        answer = client.forward(
            "probe", cni_env("CHECK"), probe_conf(probeFile=str(marker)), 30, running.sock
        )
        waited = time.monotonic() - t0
        assert answer is not None and answer.code == 0
        assert int(str(read_json(marker)["pid"])) not in idle  # a fresh worker, forked for it
        assert waited >= 1.4, f"served after {waited:.2f} s: it did not wait for a busy worker"
        assert "a call waited" in running.log.read_text()
        release.touch()
        first.join(30)
        second.join(30)
        assert [type(box1[0]), type(box2[0])] == [client.Answer, client.Answer]
        wait_for_children(running.pid, 2, timeout=20)
    finally:
        release.touch()
        stop(running.proc)


def test_a_call_waiting_while_a_worker_waits_on_a_plugin_it_ran_gets_a_worker_at_once(
    tmp_path: Path,
) -> None:
    """A busy worker waiting on a child process (a delegate it ran, which may itself be the call
    waiting in the agent's backlog) must not make that call wait --queue-wait: one more worker at
    once, or multus -> rdma-macvlan through the agent would queue behind itself."""
    running = start_agent(tmp_path, "--prefork", "1", "--queue-wait", "20")
    started, release = tmp_path / "started.json", tmp_path / "release"
    try:
        wait_for_children(running.pid, 1)
        nested, box = forward_in_thread(
            running.sock, cni_env("ADD"), probe_conf(childHoldFile=str(release), startedFile=str(started))
        )
        worker = int(str(read_json(started)["pid"]))
        deadline = time.monotonic() + 20
        while not children_of(worker):  # its child runs now (the event the agent looks for)
            assert time.monotonic() < deadline, "the worker never started its child"
            time.sleep(0.01)
        t0 = time.monotonic()
        answer = client.forward("probe", cni_env("CHECK"), probe_conf(), 30, running.sock)
        assert answer is not None and answer.code == 0
        assert time.monotonic() - t0 < 10, "the call waited for the worker that waits on its child"
        assert "waits on a plugin it ran" in running.log.read_text()
        release.touch()
        nested.join(30)
        assert type(box[0]) is client.Answer
    finally:
        release.touch()
        stop(running.proc)


# --- workers that serve several calls ----------------------------------------------------------


def _call_from(netns_name: str, sock: str, marker: Path, **conf: object) -> tuple[int, int, int]:
    """A probe ADD from a caller in ``netns_name`` (``ip netns exec``: its own mounts too), or from
    this test process when empty. Returns (exit code, caller's net inode, caller's mnt inode)."""
    stdin = probe_conf("1.1.0", probeFile=str(marker), **conf)
    if not netns_name:
        answer = client.forward("probe", cni_env("ADD"), stdin, path=sock)
        assert answer is not None
        return answer.code, os.stat("/proc/self/ns/net").st_ino, os.stat("/proc/self/ns/mnt").st_ino
    script = (
        "import json,os; from rdma_cni.agent import client; "
        f"a = client.forward('probe', {cni_env('ADD')!r}, {stdin!r}, path={sock!r}); "
        "print(json.dumps([a.code if a else -1, os.stat('/proc/self/ns/net').st_ino, "
        "os.stat('/proc/self/ns/mnt').st_ino]))"
    )
    out = subprocess.run(
        ["ip", "netns", "exec", netns_name, sys.executable, "-c", script],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    code, net, mnt = json.loads(out.stdout)
    return int(code), int(net), int(mnt)


def test_a_worker_serves_calls_one_after_another_each_in_its_callers_namespaces(
    tmp_path: Path, netns: list[str]
) -> None:
    """Callers alternate between this process (the agent's own mounts, which a worker does not
    join again) and another netns (with its own mounts): a worker serves several of them, and each
    call still runs exactly where its caller is, so a worker went home after each call."""
    running = start_agent(tmp_path, "--prefork", "1")  # one idle worker: it takes every next call
    other = new_netns(netns)
    try:
        pids = []
        for i, caller in enumerate(["", other] * 4):
            marker = tmp_path / f"call{i}.json"
            code, net, mnt = _call_from(caller, running.sock, marker)
            where = read_json(marker)
            assert code == 0 and (where["net"], where["mnt"], where["cwd"]) == (net, mnt, "/"), i
            pids.append(where["pid"])
            time.sleep(0.1)  # the spare forked during the call is trimmed again
        # Consecutive calls of the same worker came from different namespaces.
        assert any(a == b for a, b in itertools.pairwise(pids)), pids
        assert "exits after its call" not in running.log.read_text()
    finally:
        stop(running.proc)


@pytest.mark.parametrize("leak,why", [({"leakFd": True}, "descriptor"), ({"leaveThread": 5}, "thread")])
def test_a_call_that_leaves_something_behind_ends_its_worker(
    tmp_path: Path, leak: dict[str, object], why: str
) -> None:
    running = start_agent(tmp_path, "--prefork", "1")
    try:
        marker = tmp_path / "leak.json"
        assert _call_from("", running.sock, marker, **leak)[0] == 0
        leaker = int(read_json(marker)["pid"])  # type: ignore[call-overload]
        deadline = time.monotonic() + 10
        while not is_zombie(leaker) and time.monotonic() < deadline:  # gone, or exited and not reaped
            time.sleep(0.02)
        assert is_zombie(leaker)
        assert f"worker {leaker} exits after its call: the call left 1 {why}" in running.log.read_text()
        for i in range(3):  # the calls after it are served as usual
            marker = tmp_path / f"after{i}.json"
            assert _call_from("", running.sock, marker)[0] == 0
            assert read_json(marker)["pid"] != leaker
    finally:
        stop(running.proc)


def test_calls_per_worker_bounds_how_many_calls_a_worker_serves(tmp_path: Path) -> None:
    running = start_agent(tmp_path, "--calls-per-worker", "2")
    try:
        pids: dict[object, int] = {}
        for i in range(8):
            marker = tmp_path / f"n{i}.json"
            assert _call_from("", running.sock, marker)[0] == 0
            pid = read_json(marker)["pid"]
            pids[pid] = pids.get(pid, 0) + 1
        assert max(pids.values()) == 2, pids
    finally:
        stop(running.proc)


def test_after_a_burst_the_surplus_idle_workers_leave_and_no_call_is_lost(tmp_path: Path) -> None:
    running = start_agent(tmp_path)
    try:
        results: list[object] = []
        meet = str(tmp_path / "barrier")  # the six calls run at once, however slow the machine
        calls = [
            threading.Thread(
                target=lambda i=i: results.append(
                    client.forward(
                        "probe",
                        cni_env("ADD"),
                        probe_conf(barrier=meet, barrierCount=6, probeFile=str(tmp_path / f"b{i}.json")),
                        path=running.sock,
                    )
                )
            )
            for i in range(6)
        ]
        for t in calls:
            t.start()
        for t in calls:
            t.join()
        assert len(results) == 6 and all(a is not None and a.code == 0 for a in results)  # type: ignore[attr-defined]
        served = {read_json(tmp_path / f"b{i}.json")["pid"] for i in range(6)}
        assert len(served) == 6
        wait_for_children(running.pid, 2, timeout=10)  # prefork idle workers, no more
        marker = tmp_path / "after.json"
        assert _call_from("", running.sock, marker)[0] == 0
        assert read_json(marker)["pid"] in served  # a kept worker is one that had served (warm)
    finally:
        stop(running.proc)


def test_back_to_back_bursts_while_surplus_workers_are_trimmed_lose_no_call(tmp_path: Path) -> None:
    """Each burst forks workers beyond PREFORK and the next one starts while the surplus is being
    told to leave: every call must still be answered by the agent (a worker that took a connection
    serves it; one told to leave while waiting takes none). Lost 2 of 240 when the SIGTERM handler
    could fire between accept() and the call being noted."""
    running = start_agent(tmp_path)
    try:
        answers: list[object] = []
        for _ in range(30):
            calls = [
                threading.Thread(
                    target=lambda: answers.append(
                        client.forward("probe", cni_env("DEL"), probe_conf(sleep=0.02), 30, running.sock)
                    )
                )
                for _ in range(8)
            ]
            for t in calls:
                t.start()
            for t in calls:
                t.join()
        assert len(answers) == 240
        assert [a for a in answers if not isinstance(a, client.Answer) or a.code != 0] == []
    finally:
        stop(running.proc)


def _burst(sock: str, tmp: Path, tag: str, n: int = 6) -> set[int]:
    """n overlapping calls; the pids of the workers that served them.

    Each call holds its worker until all n have arrived at a barrier, so the n calls overlap however
    long starting a thread or forking a worker takes on a loaded machine (a 0.5 s, later 2 s, sleep
    let a worker finish and be reused under load).
    """
    answers: list[object] = []

    def call(i: int) -> None:
        stdin = probe_conf(
            barrier=str(tmp / f"{tag}-barrier"), barrierCount=n, probeFile=str(tmp / f"{tag}{i}.json")
        )
        answers.append(client.forward("probe", cni_env("ADD"), stdin, 30, sock))

    calls = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    assert len(answers) == n and all(isinstance(a, client.Answer) and a.code == 0 for a in answers)
    return {int(str(read_json(tmp / f"{tag}{i}.json")["pid"])) for i in range(n)}


def test_workers_left_from_a_burst_serve_the_next_burst_then_leave(tmp_path: Path) -> None:
    """Surplus idle workers stay --trim-after seconds: a second burst right after the first is
    served by the first one's (warm) workers, no fork; later only PREFORK idle workers remain."""
    running = start_agent(tmp_path, "--trim-after", "12", "--log-level", "debug")
    try:
        first = _burst(running.sock, tmp_path, "a")
        assert len(first) == 6
        kept = live_children(running.pid)
        assert first <= kept  # the burst's workers stay (plus, maybe, the spare forked during it)
        # The second burst starts once the agent knows every worker of the first is back waiting
        # (its debug line): a worker still finishing its call when a call of the second burst
        # arrives makes that call wait --queue-wait (25 ms), then get a fork, which is not the
        # trim this test is about (a loaded run saw it).
        back = [f"worker {pid} is waiting for a call again" for pid in sorted(first)]
        deadline = time.monotonic() + 30
        while not all(line in running.log.read_text() for line in back):
            assert time.monotonic() < deadline, running.log.read_text()[-2000:]
            time.sleep(0.02)
        second = _burst(running.sock, tmp_path, "b")
        assert second <= kept, "the second burst waited for forks"
        wait_for_children(running.pid, 2, timeout=60)
    finally:
        stop(running.proc)


# --- memory ------------------------------------------------------------------------------------


def _private_dirty_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return 0


def test_the_default_pool_is_prefork_idle_workers_and_only_warm_workers_hold_the_hot_pages(
    tmp_path: Path,
) -> None:
    """A burst of PREFORK calls finds a worker each without a fork; after it, the pool is PREFORK
    idle workers again, of which at most WARM_WORKERS hold the pages calls write (the others were
    replaced by shallow forks that share every page with the agent)."""
    import re

    from rdma_cni.agent.server import PREFORK, WARM_WORKERS

    running = start_agent(tmp_path, "--prefork", str(PREFORK), "--trim-after", "0.5")
    try:
        idle = wait_for_children(running.pid, PREFORK)
        first = client.forward("probe", cni_env("VERSION"), probe_conf(), 60, running.sock)
        assert isinstance(first, client.Answer) and first.code == 0
        deadline = time.monotonic() + 30
        while not (found := re.findall(r"calls write ([0-9.]+) MiB", running.log.read_text())):
            assert time.monotonic() < deadline, "the agent never learned which pages calls write"
            time.sleep(0.05)
        hot_kib = int(float(found[-1]) * 1024)
        # the first pool (forked before the agent knew what to copy) is retired but for the worker
        # that served: wait for that, not a second's sleep (not an assertion: at most 30 s)
        first_pool, deadline = idle, time.monotonic() + 30
        while time.monotonic() < deadline:
            live = live_children(running.pid)
            if len(live) == PREFORK and len(live & first_pool) <= 1:
                break
            time.sleep(0.02)
        idle = wait_for_children(running.pid, PREFORK)
        answers: list[object] = []
        marks = [tmp_path / f"burst{i}.json" for i in range(PREFORK)]
        meet = tmp_path / "burst-barrier"  # all PREFORK calls run at once, however slow the machine
        calls = [
            threading.Thread(
                target=lambda m=m: answers.append(
                    client.forward(
                        "probe",
                        cni_env("ADD"),
                        probe_conf(barrier=str(meet), barrierCount=PREFORK, probeFile=str(m)),
                        30,
                        running.sock,
                    )
                )
            )
            for m in marks
        ]
        for t in calls:
            t.start()
        for t in calls:
            t.join()
        assert all(isinstance(a, client.Answer) and a.code == 0 for a in answers)
        served = {int(str(read_json(m)["pid"])) for m in marks}
        assert served <= idle, "a call of the burst waited for a fork"
        deadline = time.monotonic() + 30
        while True:
            pids = live_children(running.pid)
            warm = {p for p in pids if _private_dirty_kib(p) >= hot_kib * 3 // 4}
            if len(pids) == PREFORK and len(warm) <= WARM_WORKERS:
                break
            assert time.monotonic() < deadline, (len(pids), len(warm), hot_kib)
            time.sleep(0.1)
    finally:
        stop(running.proc)


def test_agent_rss_with_the_plugin_stack_loaded_is_inside_the_daemonset_limit(tmp_path: Path) -> None:
    running = start_agent(tmp_path)  # default plugins: rdma-macvlan and rdma-multus, preloaded
    try:
        with open(f"/proc/{running.pid}/status") as f:
            rss_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        print(f"rdma-agent RSS: {rss_kib / 1024:.1f} MiB; log: {running.log.read_text()[-400:]}")
        assert rss_kib < 500 * 1024  # the seed's DaemonSet memory limit, 500Mi
    finally:
        stop(running.proc)
