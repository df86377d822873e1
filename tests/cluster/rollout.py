"""``scripts/bench-rollout``: what a rolling update of the product's DaemonSet (and a kill -9 of the
device plugin outside one) costs pods that are created and deleted meanwhile.

The churn is the chaos run's (tests/cluster/chaos.py: pods of 1, 2, 4 and 8 bonds created and
deleted, some forced, the seed's StatefulSet scaled), with no other fault. While it runs, the
DaemonSet is rolled ``rollouts`` times (``kubectl rollout restart``, waited for with ``rollout
status``), then the device plugin of node 1 is killed -9 ``crashes`` times. Counted per window (a
rollout from its restart to its status done, a crash for :data:`CRASH_WINDOW` seconds after it):

- pods kubelet rejected at admission (``UnexpectedAdmissionError``: the device manager had no
  healthy device when the pod came);
- CNI calls that failed (kubelet's ``FailedCreatePodSandBox`` / ``FailedKillPodSandbox`` warnings);
- creation -> Running p50/p99 of the pods created in the window, and bound -> Running (the node's
  part: a pod that waited Pending for free bonds counts its wait in the first figure only);
- the lowest allocatable of the resource any node reported meanwhile (sampled every 0.5 s: 0 means
  kubelet had the node's devices unhealthy), and the most Ready product pods one node had at once
  (2: the surge pod beside the old one).

    with cluster.exclusive():
        cluster.up(2)
        chaos.install(bins, plan)
        report = Churn(bins, plan).run(rollouts=2, crashes=1)
        print(report.text())
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster import apiread, build, chaos, cluster, faults
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import kubectl

log = logging.getLogger("rollout")

CRASH_WINDOW = 30.0  # s after a kill -9 in which a pod's fate is the crash's
SETTLE = 8.0  # s of churn before the first and after each window: pods met nothing
CNI_FAILED = ("FailedCreatePodSandBox", "FailedKillPodSandbox")


@dataclass
class Window:
    """One rollout or crash: when it began and ended (monotonic), and what happened to pods in it."""

    kind: str
    start: float
    end: float = 0.0
    rejected: int = 0
    cni_failed: int = 0
    starts: list[float] = field(default_factory=list)
    on_node: list[float] = field(default_factory=list)  # bound -> Running
    min_allocatable: int = -1  # -1: never sampled
    max_per_node: int = 0

    def text(self) -> str:
        if not self.start:
            return (f"{self.kind}: creation -> Running of its {len(self.starts)} pods: "
                    f"{chaos._quantiles(sorted(self.starts))}, bound -> Running: "
                    f"{chaos._quantiles(sorted(self.on_node))}")
        return (f"{self.kind} ({self.end - self.start:.1f} s): rejected at admission {self.rejected}, "
                f"CNI calls failed {self.cni_failed}, creation -> Running of the {len(self.starts)} pods "
                f"created in it: {chaos._quantiles(sorted(self.starts))}, bound -> Running: "
                f"{chaos._quantiles(sorted(self.on_node))}; lowest allocatable "
                f"{self.min_allocatable}, Ready product pods on one node at once {self.max_per_node}")

    def as_json(self) -> dict[str, Any]:
        s = sorted(self.starts)
        return {"kind": self.kind, "seconds": round(self.end - self.start, 1), "rejected": self.rejected,
                "cni_failed": self.cni_failed, "pods": len(s),
                "start_p50": round(chaos._q(s, 0.5), 2), "start_p99": round(chaos._q(s, 0.99), 2),
                "bound_to_running_p50": round(chaos._q(sorted(self.on_node), 0.5), 2),
                "bound_to_running_p99": round(chaos._q(sorted(self.on_node), 0.99), 2),
                "min_allocatable": self.min_allocatable, "max_per_node": self.max_per_node}

    def sample(self, bins: Binaries) -> None:
        """One look at every node's allocatable and at the product's pods per node."""
        for nd in chaos.nodes():
            _, alloc = cluster.node_resources(bins, nd.name, cluster.RDMA)
            if alloc >= 0:
                self.min_allocatable = alloc if self.min_allocatable < 0 else min(self.min_allocatable, alloc)
        try:
            pods = apiread.pods(chaos.DS, "kube-system")
        except apiread.ReadError:
            return
        per_node: dict[str, int] = {}
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp") or not w.ready(pod):
                continue  # two Ready pods on one node, none on its way out: the surge
            node = pod.get("spec", {}).get("nodeName", "")
            per_node[node] = per_node.get(node, 0) + 1
        self.max_per_node = max([self.max_per_node, *per_node.values()])


@dataclass
class Report:
    windows: list[Window]
    outcomes: dict[str, int]
    rejected: int
    cni_failed: int
    events: dict[str, int]
    lost: list[str]
    rejections: dict[str, int] = field(default_factory=dict)  # kubelet's admission messages, by class
    cni_failures: dict[str, int] = field(default_factory=dict)  # kubelet's sandbox warnings, by class

    def text(self) -> str:
        return "\n".join([
            f"pod lifecycles: {self.outcomes}",
            f"rejected at admission in the whole run: {self.rejected}; CNI calls failed: {self.cni_failed}",
            *(f"  rejected {n} x {m}" for m, n in sorted(self.rejections.items())),
            *(f"  CNI failed {n} x {m}" for m, n in sorted(self.cni_failures.items())),
            *(x.text() for x in self.windows),
            "pod warnings:" + "".join(f"\n  {n} x {m}" for m, n in sorted(self.events.items())),
            f"lost: {self.lost or 'none'}",
        ])

    def as_json(self) -> dict[str, Any]:
        return {"windows": [x.as_json() for x in self.windows], "outcomes": self.outcomes,
                "rejected": self.rejected, "cni_failed": self.cni_failed, "events": self.events,
                "lost": self.lost, "rejections": self.rejections}


class Churn(chaos.Run):
    """The chaos run's churn without its kills; rollouts and crashes happen on :meth:`run`'s schedule."""

    def churn(self) -> None:
        while not self.stop.is_set():
            self.observe()
            self.act()
            self.stop.wait(self.rng.uniform(0.1, 0.5))

    def run_windows(self, rollouts: int, crashes: int, settle: float) -> list[Window]:
        out = []
        time.sleep(settle)
        for _ in range(rollouts):
            win = Window("rollout", time.monotonic())
            kubectl(self.bins, "-n", "kube-system", "rollout", "restart", "daemonset/rdma-cni")
            with _sampling(win, self.bins):
                w.rollout(self.bins, timeout=300)
            win.end = time.monotonic()
            out.append(win)
            time.sleep(settle)
        for _ in range(crashes):
            win = Window("device-plugin kill -9", time.monotonic())
            with _sampling(win, self.bins):
                kill = faults.inject(faults.Fault("rdma-device-plugin", 1))
                assert kill.killed, "no device plugin ran on node 1"
                time.sleep(CRASH_WINDOW)
            win.end = time.monotonic()
            out.append(win)
        return out

    def measure(self, rollouts: int = 1, crashes: int = 0, settle: float = SETTLE) -> Report:
        self.quiet()
        thread = threading.Thread(target=self.churn, name="churn", daemon=True)
        thread.start()
        try:
            windows = self.run_windows(rollouts, crashes, settle)
            time.sleep(settle)
        finally:
            self.stop.set()
            thread.join()
        self.drain()
        return self.report(windows)

    def drain(self) -> None:
        """Every pod of the run deleted and gone (its fate read on the way)."""
        self.scale(0)
        for life in self.lives.values():
            if life.gone is None and "/" not in life.name:
                self.delete(life, forced=False)
        w.wait("every pod of the run gone", self._observed_all_gone, 180, 0.5)

    def report(self, windows: list[Window]) -> Report:
        failed = self.cni_failures()
        for win in windows:
            for x in self.lives.values():
                if x.outcome() == "rejected by kubelet at admission" and x.failed_at is not None:
                    win.rejected += win.start <= x.failed_at <= win.end + 5
                if x.timed and x.running is not None and win.start <= x.created <= win.end:
                    win.starts.append(x.running - x.created)
                    if x.bound is not None:
                        win.on_node.append(x.running - x.bound)
            win.cni_failed = sum(win.start - 1 <= at <= win.end + 5 for at, _ in failed)
        windows = [*windows, self.outside(windows)]
        outcomes = dict(self.outcomes())
        lost = [chaos._why(x) for x in self.lives.values() if x.outcome() == "lost"]
        rejected = outcomes.get("rejected by kubelet at admission", 0)
        rejections = Counter(chaos._generic(x.failed) for x in self.lives.values()
                             if x.outcome() == "rejected by kubelet at admission")  # fmt: skip
        classes = Counter(chaos._generic(message) for _, message in failed)
        events = dict(self.events())
        return Report(windows, outcomes, rejected, len(failed), events, lost, dict(rejections), dict(classes))

    def outside(self, windows: list[Window]) -> Window:
        """The reference: the pods created outside every window (the same churn, nothing rolling or
        crashing), with the rejections and CNI failures not counted in any window."""
        ref = Window("outside the windows (reference)", 0.0)
        for x in self.lives.values():
            if not x.timed or x.running is None or any(v.start <= x.created <= v.end for v in windows):
                continue
            ref.starts.append(x.running - x.created)
            if x.bound is not None:
                ref.on_node.append(x.running - x.bound)
        return ref

    def outcomes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for x in self.lives.values():
            out[x.outcome()] = out.get(x.outcome(), 0) + 1
        return out

    def cni_failures(self) -> list[tuple[float, str]]:
        """Monotonic times and messages of kubelet's failed-sandbox warnings for the run's pods (one
        per count)."""
        try:
            items = apiread.get_list("/api/v1/namespaces/default/events")
        except apiread.ReadError:
            return []
        ours = {x.doc.get("metadata", {}).get("uid") for x in self.lives.values()}
        offset = time.monotonic() - time.time()
        out = []
        for e in items:
            if e.get("reason") not in CNI_FAILED or e.get("involvedObject", {}).get("uid") not in ours:
                continue
            at = _epoch(e.get("lastTimestamp") or e.get("eventTime") or "")
            out += [(at + offset, str(e.get("message", "")))] * (e.get("count") or 1)
        return out


@contextlib.contextmanager
def _sampling(win: Window, bins: Binaries) -> Iterator[None]:
    """:meth:`Window.sample` every 0.5 s while the body runs."""
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            win.sample(bins)
            done.wait(0.5)

    thread = threading.Thread(target=loop, name="sample", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _epoch(stamp: str) -> float:
    """An event's RFC 3339 time (``2026-12-07T12:00:00Z``, maybe with microseconds) as epoch seconds."""
    from datetime import datetime

    if not stamp:
        return time.time()
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="rollout: %(message)s", stream=sys.stderr)
    p = argparse.ArgumentParser(prog="scripts/bench-rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=2)
    p.add_argument("--crashes", type=int, default=1)
    p.add_argument("--mode", choices=("exclusive", "shared"), default="exclusive")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-pods", type=int, default=6)
    p.add_argument("--json", help="also write the report here")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a chart value for the install (e.g. devicePlugin.instances=2); repeatable")
    a = p.parse_args(argv)
    sets = tuple(x for kv in a.set for x in ("--set", kv))
    plan = chaos.Plan(a.seed, mode=a.mode, quiet_runs=2, max_pods=a.max_pods, chart_sets=sets)
    reuse = os.environ.get("RDMA_CNI_CLUSTER_REUSE") == "1"
    with cluster.exclusive():
        try:
            if not (reuse and cluster.State.load().procs):
                cluster.up(chaos.NODES)
            bins = build.binaries()
            chaos.install(bins, plan)
            report = Churn(bins, plan).measure(a.rollouts, a.crashes)
            chaos.uninstall(bins)
        finally:
            if not reuse:
                cluster.down()
    print(report.text())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report.as_json(), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
