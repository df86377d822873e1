"""``scripts/chaos-cluster``: the 2-node test cluster under churn. Pods of 1, 2, 4 and 8 bonds (with
as many GPUs) are created and deleted (some with ``--force --grace-period=0``) and the seed's
StatefulSet is scaled, while every component is killed -9 in turn (tests/cluster/faults.py) and the
product's DaemonSet rolls once in the middle. Checked while it runs and at the end:
tests/cluster/invariants.py. One seed draws the same schedule of choices; what each choice meets
depends on the machine's timing.

    with cluster.exclusive():
        cluster.up(2)
        chaos.install(bins, plan)
        report = chaos.Run(bins, plan).run()
        print(report.text())

A pod's life is classed, so the report keeps what Kubernetes refuses by design (a pod asking for more
bonds than a node has free stays Pending on ``Insufficient``; a create while the API server is down
fails) apart from what must never happen: a pod bound to a node that never runs, a pod that never
goes, a container restarted, a pod whose network is not its allocation, a bond left behind.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from cluster import apiread, build, chart, cluster, faults
from cluster import invariants as inv
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import GPU, RDMA, kubectl
from cluster.node import Node

log = logging.getLogger("chaos")

NODES = 2
SIZES = (1, 2, 4, 8)
CHAOS = "chaos=1"
SEED = "k8s-app=ibv-app"
DS = "k8s-app=rdma-cni"
LOST_AFTER = 120.0  # s a pod may sit bound to a node without running before it counts as lost
PENDING_GIVE_UP = 15.0  # s a chaos pod stays Pending before the schedule may delete it
REFUSED = ("Insufficient", "cannot allocate all claims")  # the scheduler's "no" by design
# kubelet's device manager refuses a pod bound while the node's device plugin is away (killed, or
# not yet registered with a restarted kubelet): the pod ends Failed and only a controller replaces it
ADMISSION = "UnexpectedAdmissionError"
# warnings about the test cluster itself, not the pods' network: no cluster DNS is configured here
NOISE = ("MissingClusterDNS",)
ROLLOUT = "daemonset-rollout"  # counted with the kills: the DaemonSet's rolling update mid-run


@dataclass(frozen=True)
class Plan:
    """A run: ``seconds`` of chaos, or until ``cycles`` pod lifecycles have completed."""

    seed: int = 1
    seconds: float = 0.0
    cycles: int = 0
    front_end: str = "devicePlugin"
    mode: str = "exclusive"
    fault_every: float = 4.0  # mean seconds between two kills
    quiet_runs: int = 4  # pods started one at a time with no fault, before the chaos: the quiet figure
    max_pods: int = 6  # chaos pods alive at once (besides the StatefulSet's)
    check_every: float = 2.0
    only: tuple[str, ...] = ()  # kill only these components (what one kind of fault costs); () all
    chart_sets: tuple[str, ...] = ()  # more helm flags ("--set", "k=v", ...) for the install


@dataclass
class Life:
    """One pod from its creation to its end, as the run saw it."""

    name: str
    size: int
    created: float  # monotonic: kubectl create returned (chaos pods) or first seen (StatefulSet)
    timed: bool  # a creation this run timed (chaos pods whose create answered)
    uid: str = ""
    node: str = ""
    bound: float | None = None
    running: float | None = None
    deleting: float | None = None
    forced: bool = False
    gone: float | None = None
    unschedulable: str = ""
    restarts: int = 0
    failed: str = ""
    failed_at: float | None = None
    suspect: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    doc: dict[str, Any] = field(default_factory=dict)

    def outcome(self) -> str:
        if self.wrong:
            return "wrong"
        if self.failed.startswith(ADMISSION):
            return "rejected by kubelet at admission"
        if self.failed or self.restarts:
            return "lost"
        if self.gone is None:
            return "lost" if self.seen else "never created"
        if self.running is not None:
            return "completed"
        if self.bound is not None and (self.gone - self.bound) > LOST_AFTER:
            return "lost"
        if any(r in self.unschedulable for r in REFUSED):
            return "refused (Insufficient)"
        return "deleted before running"

    @property
    def seen(self) -> bool:
        return bool(self.uid)


@dataclass
class Report:
    plan: Plan
    lives: list[Life]
    kills: list[faults.Kill]
    quiet: list[float]
    errors: Counter[str]
    end_errors: list[str]
    events: Counter[str]
    seconds: float

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(life.outcome() for life in self.lives)

    @property
    def lost(self) -> list[str]:
        return [_why(x) for x in self.lives if x.outcome() == "lost"]

    @property
    def wrong(self) -> list[str]:
        mine = [f"{x.name}: {'; '.join(x.wrong)}" for x in self.lives if x.wrong]
        return mine + [k for k in self.errors if k.startswith("WRONG")]

    @property
    def starts(self) -> list[float]:
        return sorted(x.running - x.created for x in self.lives if x.timed and x.running is not None)

    def text(self) -> str:
        p = self.plan
        k = Counter(x.fault.component for x in self.kills if x.killed)
        skipped = Counter(x.fault.component for x in self.kills if not x.killed)
        out = [
            f"chaos run: front end {p.front_end}, mode {p.mode}, seed {p.seed}, {self.seconds:.0f} s",
            f"pod lifecycles: {dict(self.outcomes)}",
            f"kills ({sum(k.values())}): {dict(sorted(k.items()))}"
            + (f"; not running when drawn: {dict(skipped)}" if skipped else ""),
            f"creation -> Running under chaos: {_quantiles(self.starts)}; "
            f"quiet: {_quantiles(sorted(self.quiet))}",
            f"errors by class: {dict(self.errors) or 'none'}",
            "pod warnings (kubelet, scheduler):"
            + "".join(f"\n  {n} x {m}" for m, n in self.events.most_common()),
            f"lost: {self.lost or 'none'}",
            f"wrong: {self.wrong or 'none'}",
            f"end invariants: {self.end_errors or 'all hold'}",
        ]
        out += [f"  slow: {s}" for s in self._slowest()]
        out += [
            f"  starts that met one kill, of {c}: {_quantiles(v)}" for c, v in self.starts_by_fault().items()
        ]
        causes = self.rejection_causes()
        if causes:
            out.append(f"rejected at admission, by what came last on its node within 30 s: {dict(causes)}")
        return "\n".join(out)

    def starts_by_fault(self) -> dict[str, list[float]]:
        """Creation -> Running of the pods that met exactly one kill while they started (on their
        node, of the control plane, or the rollout), by the component killed: what one fault costs a
        start, without the others that overlap it."""
        out: dict[str, list[float]] = {}
        for x in self.lives:
            if not x.timed or x.running is None:
                continue
            met = [k.fault.component for k in self.kills if k.killed and x.created <= k.at <= x.running
                   and (k.fault.node == 0 or k.fault.name.startswith(f"{x.node}/"))]  # fmt: skip
            if len(met) == 1:
                out.setdefault(met[0], []).append(x.running - x.created)
        return {c: sorted(v) for c, v in sorted(out.items())}

    def rejection_causes(self) -> Counter[str]:
        """For each pod kubelet rejected: the fault on its node (or the rollout) just before."""
        out: Counter[str] = Counter()
        for x in self.lives:
            if x.outcome() != "rejected by kubelet at admission" or x.failed_at is None:
                continue
            at = x.failed_at
            near = [k for k in self.kills if k.killed and at - 30 <= k.at <= at
                    and (k.fault.name.startswith(f"{x.node}/") or k.fault.component == ROLLOUT)]  # fmt: skip
            out[max(near, key=lambda k: k.at).fault.component if near else "nothing"] += 1
        return out

    def _slowest(self, n: int = 5) -> list[str]:
        timed = [x for x in self.lives if x.timed and x.running is not None]
        timed.sort(key=lambda x: x.running - x.created, reverse=True)  # type: ignore[operator]
        out = []
        for x in timed[:n]:
            assert x.running is not None
            during = [f"{k.fault.name}@{k.at - x.created:+.1f}" for k in self.kills if
                      x.created - 5 <= k.at <= x.running and k.killed]  # fmt: skip
            out.append(
                f"{x.name} ({x.size}) {x.running - x.created:.1f} s, kills: {', '.join(during) or '-'}"
            )
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "plan": self.plan.__dict__,
            "seconds": self.seconds,
            "outcomes": dict(self.outcomes),
            "kills": dict(Counter(x.fault.component for x in self.kills if x.killed)),
            "starts_p50_p99": [_q(self.starts, 0.5), _q(self.starts, 0.99)],
            "quiet_p50_p99": [_q(sorted(self.quiet), 0.5), _q(sorted(self.quiet), 0.99)],
            "errors": dict(self.errors),
            "events": dict(self.events),
            "rejections": dict(self.rejection_causes()),
            "starts_by_fault": {
                c: [_q(v, 0.5), _q(v, 0.99), len(v)] for c, v in self.starts_by_fault().items()
            },
            "lost": self.lost,
            "lives": [
                {
                    "name": x.name,
                    "size": x.size,
                    "node": x.node,
                    "outcome": x.outcome(),
                    "start": None if x.running is None or not x.timed else round(x.running - x.created, 3),
                }
                for x in self.lives
            ],
            "wrong": self.wrong,
            "end_errors": self.end_errors,
        }


def _why(x: Life) -> str:
    if x.failed or x.restarts:
        return f"{x.name}: {x.failed or f'{x.restarts} container restart(s)'}"
    if x.gone is None:
        return f"{x.name}: not gone at the end"
    return f"{x.name}: bound to {x.node} and not running for {LOST_AFTER:.0f} s"


def _q(xs: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted ``xs`` (0.0 for none)."""
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def _quantiles(xs: list[float]) -> str:
    return f"p50 {_q(xs, 0.5):.2f} s, p99 {_q(xs, 0.99):.2f} s (n={len(xs)})" if xs else "none"


# --------------------------------------------------------------------------- what the pods are


def pod_doc(name: str, size: int, mode: str) -> str:
    """The seed's pod with ``size`` bonds and GPUs (shared mode: its annotation, every bond shared,
    ``size`` of the resource's shares), a 1 s grace period, on the labelled nodes."""
    sts = yaml.safe_load(w.seed_statefulset())
    tmpl = sts["spec"]["template"]
    spec = tmpl["spec"]
    spec["containers"][0]["resources"] = {"limits": {RDMA: str(size), GPU: str(size)}}
    spec["containers"][0]["command"] = ["sleep", "1000000"]
    spec["terminationGracePeriodSeconds"] = 1
    spec["nodeSelector"] = {w.LABEL: "true"}
    annotations = dict(tmpl["metadata"]["annotations"])
    if mode == "shared":
        annotations["tke.cloud.tencent.com/networks"] = "tke-route-eni,tke-rdma-ipvlan"
    meta = {"name": name, "labels": {"chaos": "1"}, "annotations": annotations}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def statefulset(mode: str) -> str:
    """The seed's StatefulSet at 0 replicas, its pods' grace cut to 1 s (the seed's ``sh`` ignores
    SIGTERM: at the default 30 s each scale-down would hold its bonds half a minute)."""
    doc = yaml.safe_load(w.seed_statefulset(replicas=0))
    doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    if mode == "shared":
        doc["spec"]["template"]["metadata"]["annotations"]["tke.cloud.tencent.com/networks"] = (
            "tke-route-eni,tke-rdma-ipvlan"
        )
    return yaml.safe_dump(doc)


def install(bins: Binaries, plan: Plan) -> None:
    """The product with Helm on both nodes, its offer in the API, and the seed's StatefulSet at 0."""
    w.label_nodes(bins, NODES)
    sets = ["--set", f"frontEnd={plan.front_end}", "--set", f"rdmaMode={plan.mode}"]
    if plan.mode == "shared":
        sets += ["--set", "shared.link=macvlan"]  # this kernel has no IPVLAN
    sets += list(plan.chart_sets)
    chart.on_cluster("uninstall", chart.RELEASE, "-n", chart.NAMESPACE, "--ignore-not-found", check=False)
    chart.on_cluster(*chart.release_args("install", *sets))
    w.wait_ready(bins, DS, NODES, "kube-system", timeout=240)
    for nd in nodes():
        w.wait(f"{nd.name} offers its bonds", functools.partial(_offers, bins, nd, plan), 120)
    w.apply(bins, statefulset(plan.mode))


def _offers(bins: Binaries, nd: Node, plan: Plan) -> bool:
    return not inv.resource_errors(bins, nd, plan.front_end, plan.mode)


def uninstall(bins: Binaries) -> None:
    kubectl(bins, "delete", "statefulset", "ibv-app", "--ignore-not-found", "--wait=true", timeout=180)
    chart.on_cluster("uninstall", chart.RELEASE, "-n", chart.NAMESPACE, "--wait", "--timeout", "120s")


def nodes() -> list[Node]:
    return [Node(n) for n in range(1, NODES + 1)]


# --------------------------------------------------------------------------- the run


class Run:
    """One chaos run on an installed cluster: :meth:`run` gives the :class:`Report`."""

    def __init__(self, bins: Binaries, plan: Plan) -> None:
        self.bins, self.plan = bins, plan
        self.rng = random.Random(plan.seed)
        self.lives: dict[str, Life] = {}
        self.kills: list[faults.Kill] = []
        self.errors: Counter[str] = Counter()
        self.seq = 0
        self.dups: dict[str, set[str]] = {}  # the last check's, per node: wrong when seen twice in a row
        self.stop = threading.Event()
        self.baseline = {nd.name: self._node_state(nd) for nd in nodes()}

    # -- actions

    def _kubectl(self, what: str, *args: str, stdin: str | None = None) -> bool:
        """A write as a user types it; a failure is counted by class (the API server or etcd being
        down is expected under chaos) and the caller tries again later."""
        try:
            proc = kubectl(self.bins, "--request-timeout=20s", *args, check=False, stdin=stdin, timeout=40)
        except subprocess.TimeoutExpired:
            self.errors[f"{what}: kubectl timed out (expected while the control plane restarts)"] += 1
            return False
        if proc.returncode == 0:
            return True
        said = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        expected = any(
            s in said for s in ("refused", "connection reset", "timeout", "etcdserver", "EOF", "unavailable")
        )
        tag = "expected while the control plane restarts" if expected else "UNEXPECTED"
        self.errors[f"{what}: {_generic(said)} ({tag})"] += 1
        return False

    def create(self, size: int) -> Life:
        self.seq += 1
        name = f"chaos-{self.seq}"
        t0 = time.monotonic()
        ok = self._kubectl("create", "create", "-f", "-", stdin=pod_doc(name, size, self.plan.mode))
        life = Life(name, size, t0, timed=ok)
        self.lives[name] = life
        return life

    def delete(self, life: Life, forced: bool) -> None:
        grace = ["--force", "--grace-period=0"] if forced else ["--grace-period=1"]
        if self._kubectl("delete", "delete", "pod", life.name, "--wait=false", "--ignore-not-found", *grace):
            life.deleting, life.forced = time.monotonic(), forced

    def scale(self, replicas: int) -> None:
        self._kubectl("scale", "scale", "statefulset", "ibv-app", f"--replicas={replicas}")

    def act(self) -> None:
        """One draw of the schedule: scale the StatefulSet, create a pod, or delete one."""
        r = self.rng.random()
        mine = [x for x in self.lives.values() if "/" not in x.name and x.deleting is None and x.gone is None]
        if r < 0.07:
            self.scale(self.rng.choice((0, 1, 2)))
        elif r < 0.55 and len(mine) < self.plan.max_pods:
            self.create(self.rng.choice(SIZES))
        else:
            now = time.monotonic()
            hold = self.rng.uniform(0.0, 3.0)
            ready = [
                x for x in mine if (x.running and now - x.running > hold) or now - x.created > PENDING_GIVE_UP
            ]
            if ready:
                self.delete(self.rng.choice(ready), forced=self.rng.random() < 0.25)

    # -- what the API says

    def observe(self) -> None:
        """Every pod of the run as the API server has it now (nothing while it does not answer)."""
        try:
            docs = apiread.pods(CHAOS) + apiread.pods(SEED)
        except apiread.ReadError:
            return
        now = time.monotonic()
        present = set()
        for doc in docs:
            life = self._life_of(doc, now)
            present.add(life.name)
            _update(life, doc, now)
        for life in self.lives.values():
            if life.gone is None and life.seen and life.name not in present:
                life.gone = now
                life.deleting = life.deleting or now

    def _life_of(self, doc: dict[str, Any], now: float) -> Life:
        meta = doc["metadata"]
        name = meta["name"] if meta["name"].startswith("chaos-") else f"{meta['name']}/{meta['uid']}"
        if name not in self.lives:
            size = int(doc["spec"]["containers"][0]["resources"]["limits"][RDMA])
            self.lives[name] = Life(name, size, now, timed=False)
        return self.lives[name]

    # -- invariants while it runs

    def check(self) -> None:
        """Each Running pod exactly its allocation, and nothing in two pods, on every node."""
        for nd in nodes():
            allocs = {} if self.plan.front_end == "dra" else inv.allocations(nd)
            if allocs is None:
                continue
            held: dict[str, list[str]] = {}
            said = inv.holders(inv.metrics(nd)) if self.plan.mode == "exclusive" else {}
            for life in self.lives.values():
                if life.running is None or life.deleting or life.gone or life.node != nd.name:
                    continue
                if life.doc.get("metadata", {}).get("deletionTimestamp"):
                    continue
                seen = inv.pod_view(nd, life.doc)
                if seen is None:
                    continue
                errs = self._pod_errors(nd, life, seen, allocs, said)
                if errs is None:
                    continue
                _judge(life, errs)
                held[life.name] = [a for v in seen.bonds.values() for a in v]
            dups = set(inv.duplicates(held))
            for dup in dups & self.dups.get(nd.name, set()):
                self.errors[f"WRONG: {dup}"] += 1
            self.dups[nd.name] = dups

    def _pod_errors(
        self,
        nd: Node,
        life: Life,
        seen: inv.PodView,
        allocs: dict[tuple[str, str], set[str]],
        said: dict[str, str],
    ) -> list[str] | None:
        """How one Running pod differs from its allocation (None: its allocation cannot be read now).
        ``said``: the agent's bond holders (empty when it did not answer)."""
        if self.plan.mode == "shared":
            return inv.shared_errors(nd, seen)
        name = life.doc["metadata"]["name"]
        mine = (
            inv.claim_bonds(life.doc)
            if self.plan.front_end == "dra"
            else allocs.get(("default", name), set())
        )
        if mine is None:
            return None
        errs = inv.exclusive_errors(nd, seen, mine)
        if said:  # the agent answered: its holders name this pod for each of its bonds
            errs += [f"metrics: {b} held by {said.get(b)!r}" for b in mine if said.get(b) != name]
        return errs

    # -- faults

    def _faults(self) -> None:
        rng = random.Random(self.plan.seed * 7919 + 1)
        names = [
            c for c in faults.components(self.plan.front_end) if not self.plan.only or c in self.plan.only
        ]
        while not self.stop.wait(rng.uniform(0.5, 1.5) * self.plan.fault_every):
            fault = faults.pick(rng, names, NODES)
            try:
                self.kills.append(faults.inject(fault))
            except Exception as e:  # noqa: BLE001 (a start that failed: said, and tried again below)
                self.errors[f"HARNESS: {fault.name} not started again: {str(e)[:200]}"] += 1
            w.keep_scheduler()
            self._restart_dead()

    def _restart_dead(self) -> None:
        """Whatever the harness kills and restarts must run again before the next fault."""
        for st_proc in cluster.State.load().procs:
            comp = st_proc.name.rsplit("/", 1)[-1]
            if comp in faults.SERVICES or comp in faults.STATIC_PODS:
                try:
                    cluster.restart_if_dead(st_proc.name)
                except Exception as e:  # noqa: BLE001
                    self.errors[f"HARNESS: {st_proc.name} not started again: {str(e)[:200]}"] += 1

    # -- the whole run

    def run(self) -> Report:
        t0 = time.monotonic()
        quiet = self.quiet()
        started = time.monotonic()
        thread = threading.Thread(target=self._faults, name="faults", daemon=True)
        thread.start()
        rolled, last_check = False, 0.0
        try:
            while not self._done(started):
                self.observe()
                if not rolled and self._halfway(started):
                    rolled = self._kubectl(
                        "rollout", "-n", "kube-system", "rollout", "restart", "daemonset/rdma-cni"
                    )
                    if rolled:
                        self.kills.append(faults.Kill(faults.Fault(ROLLOUT), time.monotonic(), True))
                if time.monotonic() - last_check > self.plan.check_every:
                    self.check()
                    last_check = time.monotonic()
                self.act()
                time.sleep(self.rng.uniform(0.1, 0.5))
        finally:
            self.stop.set()
            thread.join()
        self._restart_dead()
        end_errors = self.finish()
        return Report(self.plan, list(self.lives.values()), self.kills, quiet, self.errors, end_errors,
                      self.events(), time.monotonic() - t0)  # fmt: skip

    def _done(self, started: float) -> bool:
        if self.plan.seconds:
            return time.monotonic() - started >= self.plan.seconds
        return sum(x.outcome() == "completed" for x in self.lives.values()) >= self.plan.cycles

    def _halfway(self, started: float) -> bool:
        if self.plan.seconds:
            return time.monotonic() - started >= self.plan.seconds / 2
        return sum(x.outcome() == "completed" for x in self.lives.values()) >= self.plan.cycles / 2

    def quiet(self) -> list[float]:
        """Pods of each size started one at a time with no fault: the figure chaos is held against."""
        took = []
        for i in range(self.plan.quiet_runs):
            life = self.create(SIZES[i % len(SIZES)])
            w.wait(f"{life.name} Running", functools.partial(self._observed, life, "running"), 120, 0.05)
            assert life.running is not None
            took.append(life.running - life.created)
            self.delete(life, forced=False)
            w.wait(f"{life.name} gone", functools.partial(self._observed, life, "gone"), 120, 0.1)
        for name in [x.name for x in self.lives.values()]:
            del self.lives[name]  # the quiet pods are not the chaos run's lifecycles
        return took

    def _observed(self, life: Life, when: str) -> float | None:
        """``life``'s time of ``when`` (running, gone) after reading the API again."""
        self.observe()
        at: float | None = getattr(life, when)
        return at

    def finish(self) -> list[str]:
        """Every pod deleted, then the end invariants; what does not hold, said per node."""
        self.scale(0)
        for life in self.lives.values():
            if life.gone is None and "/" not in life.name:
                self.delete(life, forced=False)
        kubectl(self.bins, "delete", "pods", "-l", SEED, "--grace-period=1", "--wait=false", check=False)
        try:
            w.wait("every pod of the run gone", lambda: self._observed_all_gone(), 180, 0.5)
        except TimeoutError as e:
            return [str(e)]
        w.rollout(self.bins)
        w.wait_ready(self.bins, DS, NODES, "kube-system", timeout=240)
        errs = []
        try:
            w.wait_exact(nodes(), {k: v["network"] for k, v in self.baseline.items()}, 120)
        except AssertionError as e:
            errs.append(str(e))
        try:
            w.wait("the nodes as before the run", lambda: not self._end_errors(), 90, 2)
        except TimeoutError:
            errs += self._end_errors()
        return errs

    def _observed_all_gone(self) -> bool:
        self.observe()
        return all(x.gone is not None or not x.seen for x in self.lives.values())

    def _node_state(self, nd: Node) -> dict[str, Any]:
        return {"network": w.node_network(nd), "files": inv.node_files(nd), "iptables": inv.cni_iptables(nd)}

    def _end_errors(self) -> list[str]:
        errs = []
        for nd in nodes():
            now, before = self._node_state(nd), self.baseline[nd.name]
            for kind in ("files", "iptables"):
                if now[kind] != before[kind]:
                    errs.append(f"{nd.name} {kind}: {before[kind]} -> {now[kind]}")
            errs += [
                f"{nd.name}: {e}"
                for e in inv.resource_errors(self.bins, nd, self.plan.front_end, self.plan.mode)
            ]
            errs += [f"{nd.name} metrics: {e}" for e in inv.metrics_errors(inv.metrics(nd))]
        if self.plan.front_end == "dra":
            errs += [f"claim left: {c}" for c in inv.claims_left()]
        return errs

    def events(self) -> Counter[str]:
        """Warnings kubelet and the scheduler gave the run's pods, by reason and message class."""
        try:
            items = apiread.get_list("/api/v1/namespaces/default/events")
        except apiread.ReadError:
            return Counter()
        ours = {x.doc.get("metadata", {}).get("uid") for x in self.lives.values()}
        out: Counter[str] = Counter()
        for e in items:
            if e.get("reason") in NOISE or e.get("involvedObject", {}).get("uid") not in ours:
                continue
            if e.get("type") == "Warning":
                out[f"{e.get('reason')}: {_generic(e.get('message', ''))}"] += e.get("count") or 1
        return out


def _update(life: Life, doc: dict[str, Any], now: float) -> None:
    """What one read of the pod tells: bound, Running, Failed, restarted, unschedulable."""
    life.doc, life.uid = doc, doc["metadata"]["uid"]
    spec, status = doc.get("spec", {}), doc.get("status", {})
    if spec.get("nodeName") and life.bound is None:
        life.node, life.bound = spec["nodeName"], now
    containers = status.get("containerStatuses") or []
    if (
        life.running is None
        and status.get("phase") == "Running"
        and containers
        and all("running" in c.get("state", {}) for c in containers)
    ):
        life.running = now
    # a pod deleted while its container ran ends Failed (exit 137): that is its deletion, not a loss
    if status.get("phase") == "Failed" and not doc["metadata"].get("deletionTimestamp") and not life.deleting:
        life.failed = f"{status.get('reason')}: {status.get('message')}"
        life.failed_at = life.failed_at or now
    life.restarts = max([life.restarts, *(c.get("restartCount", 0) for c in containers)])
    for c in status.get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            life.unschedulable = c.get("message", "")


def _judge(life: Life, errs: list[str]) -> None:
    """A difference seen twice in a row is wrong (one read may race a pod's start or end)."""
    if errs and life.suspect:
        life.wrong = errs
    life.suspect = errs


def _generic(message: str) -> str:
    """A message with its pod-specific parts (names, ids, numbers) cut, so messages count by class."""
    message = re.sub(r"\b[0-9a-f]{12,}\b", "<id>", message)
    message = re.sub(r"chaos-\d+|ibv-app-\d+", "<pod>", message)
    message = re.sub(r"\d+(\.\d+)?", "N", message)
    return message[:400]


# --------------------------------------------------------------------------- scripts/chaos-cluster


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="chaos: %(message)s", stream=sys.stderr)
    p = argparse.ArgumentParser(prog="scripts/chaos-cluster", description=__doc__.split("\n\n")[0])
    how_long = p.add_mutually_exclusive_group(required=True)
    how_long.add_argument("--seconds", type=float, default=0.0)
    how_long.add_argument("--cycles", type=int, default=0, help="until this many pod lifecycles completed")
    p.add_argument("--front-end", choices=("devicePlugin", "dra"), default="devicePlugin")
    p.add_argument("--mode", choices=("exclusive", "shared"), default="exclusive")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault-every", type=float, default=4.0, help="mean seconds between two kills")
    p.add_argument("--quiet-runs", type=int, default=8)
    p.add_argument("--json", help="also write the report here")
    p.add_argument(
        "--only", nargs="+", default=(), metavar="COMPONENT", help="kill only these (e.g. rdma-agent)"
    )
    a = p.parse_args(argv)
    plan = Plan(
        a.seed, a.seconds, a.cycles, a.front_end, a.mode, a.fault_every, a.quiet_runs, only=tuple(a.only)
    )
    reuse = os.environ.get("RDMA_CNI_CLUSTER_REUSE") == "1"
    with cluster.exclusive():
        try:
            if not (reuse and cluster.State.load().procs):
                cluster.up(NODES)
            bins = build.binaries()
            install(bins, plan)
            report = Run(bins, plan).run()
            uninstall(bins)
        finally:
            if not reuse:
                cluster.down()
    print(report.text())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report.as_json(), f, indent=1)
    return 1 if report.lost or report.wrong or report.end_errors else 0


if __name__ == "__main__":
    sys.exit(main())
