"""``scripts/bench-footprint``: what the DaemonSet's pod costs a node, idle and busy, against the budget
TKE's guide gives the component (CPU request 10m, limit 50m; memory request 100Mi, limit 500Mi).

On the real test cluster (one node, the chart as shipped: conf/k8s/rdma-cni.yaml's rendering), read
from the pod's own containers' cgroups (cgroup v1: ``cpuacct.usage``, ``memory.stat``), so that
everything a container runs counts, its exec readiness probes included:

- **idle**: ``--idle`` seconds in which no pod changes: millicores per container;
- **busy**: ``--lifecycles`` lifecycles of TKE's 4-bond pod (its container with ``tke-shared-rdma: 4``
  and the ``tke-rdma-macvlan`` annotation, created, Running, deleted, its bonds back), the CPU each
  container spent beyond its idle rate, per lifecycle, and the pods' creation -> Running p50 and p99;
- **memory**: each container's working set (usage minus inactive file pages, as kubelet counts it
  for eviction and ``kubectl top``) and RSS at the end.

``--threads`` also prints where the idle CPU went: every process and thread of the pod with the CPU
it used during the idle period (``/proc/<pid>/task/<tid>/stat``), and the processes that started and
ended in it (exec probes), counted from the cgroup's ``cpuacct.usage`` minus the survivors'.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster import apiread, build, chart, cluster, invariants
from cluster import workloads as w
from cluster.bench import one
from cluster.build import Binaries
from cluster.node import Node

CGROUP = Path("/sys/fs/cgroup")
CLK_TCK = os.sysconf("SC_CLK_TCK")
# TKE's guide, per container of the component
BUDGET_CPU_REQUEST_M = 10
BUDGET_CPU_LIMIT_M = 50
BUDGET_MEMORY_REQUEST_MI = 100
BUDGET_MEMORY_LIMIT_MI = 500


@dataclass(frozen=True)
class Container:
    """One running container of the DaemonSet's pod and its cgroup directory (relative to a hierarchy)."""

    name: str
    cgroup: str

    def cpu_ns(self) -> int:
        return int((CGROUP / "cpuacct" / self.cgroup / "cpuacct.usage").read_text())

    def memory(self) -> tuple[int, int]:
        """(working set, RSS) in bytes."""
        base = CGROUP / "memory" / self.cgroup
        usage = int((base / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (base / "memory.stat").read_text().splitlines())
        return usage - int(stat.get("total_inactive_file", 0)), int(stat.get("total_rss", 0))

    def pids(self) -> list[int]:
        return [int(p) for p in (CGROUP / "cpuacct" / self.cgroup / "cgroup.procs").read_text().split()]


def containers(node: Node) -> list[Container]:
    """The rdma-cni pod's running containers on ``node`` (not its finished init container)."""
    pods = apiread.pods("k8s-app=rdma-cni", "kube-system")
    if len(pods) != 1:
        raise RuntimeError(f"expected one rdma-cni pod, found {len(pods)}")
    uid = pods[0]["metadata"]["uid"]
    found = []
    base = CGROUP / "cpuacct" / node.cgroup_root.lstrip("/")
    for st in pods[0]["status"].get("containerStatuses", []):
        cid = st.get("containerID", "").split("://")[-1]
        if not cid or "running" not in st.get("state", {}):
            continue
        hits = list(base.glob(f"kubepods/**/pod{uid}/{cid}"))
        if len(hits) != 1:
            raise RuntimeError(f"container {st['name']}: {len(hits)} cgroups for {cid[:12]}")
        found.append(Container(st["name"], str(hits[0].relative_to(CGROUP / "cpuacct"))))
    return sorted(found, key=lambda c: c.name)


def cpu(cs: Sequence[Container]) -> dict[str, int]:
    return {c.name: c.cpu_ns() for c in cs}


def task_ticks(cs: Sequence[Container]) -> dict[tuple[str, int, int, str], int]:
    """(container, pid, tid, comm) -> utime + stime in clock ticks, of every live thread of the pod."""
    out = {}
    for c in cs:
        for pid in c.pids():
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    fields = task.joinpath("stat").read_text().rsplit(")", 1)
                    comm = fields[0].split("(", 1)[1]
                    rest = fields[1].split()
                except (OSError, IndexError):
                    continue
                out[(c.name, pid, int(task.name), comm)] = int(rest[11]) + int(rest[12])
    return out


def idle(cs: Sequence[Container], seconds: float, threads: bool) -> dict[str, float]:
    """Millicores per container over ``seconds`` in which nothing changes on the node."""
    t_before = task_ticks(cs) if threads else {}
    before, t0 = cpu(cs), time.monotonic()
    time.sleep(seconds)
    after, took = cpu(cs), time.monotonic() - t0
    rates = {n: (after[n] - before[n]) / took / 1e6 for n in before}
    if threads:
        print_threads(t_before, task_ticks(cs), after, before, took)
    return rates


def print_threads(
    t0: dict[tuple[str, int, int, str], int],
    t1: dict[tuple[str, int, int, str], int],
    after: dict[str, int],
    before: dict[str, int],
    took: float,
) -> None:
    """Where the idle CPU went: the busiest surviving threads, and what processes that came and went
    (exec probes, children) spent, per container."""
    ms_per_tick = 1000 / CLK_TCK
    survivors: dict[str, float] = {}
    rows = []
    for key, ticks in t1.items():
        if key in t0:
            spent = (ticks - t0[key]) * ms_per_tick
            survivors[key[0]] = survivors.get(key[0], 0.0) + spent
            rows.append((spent, key))
    print(f"where the idle CPU went ({took:.0f} s; CPU ms; a tick is {ms_per_tick:.0f} ms):")
    for spent, (name, pid, tid, comm) in sorted(rows, reverse=True)[:15]:
        if spent:
            print(f"  {name:<20} pid {pid:<7} tid {tid:<7} {comm:<16} {spent:8.0f} ms")
    for name in sorted(after):
        total = (after[name] - before[name]) / 1e6
        print(
            f"  {name:<20} processes that came and went (exec probes): "
            f"{total - survivors.get(name, 0):8.0f} ms"
        )


def call_cpu(nd: Node) -> dict[tuple[str, str, str], float]:
    """(plugin, verb, part) -> CPU seconds the agent's workers counted so far
    (``rdma_cni_cni_call_cpu_seconds_total``: our code, the delegates it ran, the API requests)."""
    out = {}
    for key, value in invariants.metrics(nd).items():
        if key.startswith("rdma_cni_cni_call_cpu_seconds_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
            out[(labels["plugin"], labels["verb"], labels["part"])] = value
    return out


def print_call_cpu(
    before: dict[tuple[str, str, str], float], after: dict[tuple[str, str, str], float], n: int
) -> None:
    """Where the agent's CPU per lifecycle went, by CNI call and part."""
    print("  the agent's workers per lifecycle, by call (ms; plugin = our code, delegates = programs it ran,")
    print("  kube_api = API requests; a delegate served by the agent is counted as its own call too):")
    for key in sorted(after):
        spent = (after[key] - before.get(key, 0.0)) / n * 1000
        if spent >= 0.05:
            print(f"    {key[0]:<14} {key[1]:<4} {key[2]:<10} {spent:7.1f}")


def lifecycles(
    bins: Binaries, nd: Node, cs: Sequence[Container], n: int
) -> tuple[dict[str, int], float, list[float]]:
    """``n`` lifecycles of TKE's 4-bond pod: the CPU ns each container spent, the wall time, and each
    pod's creation -> Running."""
    clean = w.node_network(nd)
    before, t0 = cpu(cs), time.monotonic()
    starts = []
    for i in range(n):
        starts.append(one(bins, f"footprint-{i}", True))
        w.wait_exact([nd], {nd.name: clean})
    after = cpu(cs)
    return {k: after[k] - before[k] for k in before}, time.monotonic() - t0, starts


def p99(xs: Sequence[float]) -> float:
    """The nearest-rank 99th percentile (with fewer than 100 samples: the largest)."""
    s = sorted(xs)
    return s[max(0, -(-99 * len(s) // 100) - 1)]


def report(
    rates: dict[str, float],
    idle_s: float,
    spent: dict[str, int],
    wall: float,
    n: int,
    starts: list[float],
    mem: dict[str, tuple[int, int]],
    limits: dict[str, dict[str, str]],
) -> dict[str, object]:
    print(
        f"\nidle over {idle_s:.0f} s (TKE's guide: request {BUDGET_CPU_REQUEST_M}m, "
        f"limit {BUDGET_CPU_LIMIT_M}m per container):"
    )
    for name, m in rates.items():
        print(f"  {name:<20} {m:7.2f} millicores   (limit shipped: {limits.get(name, {}).get('cpu', '-')})")
    print(f"  {'the pod':<20} {sum(rates.values()):7.2f} millicores")
    print(f"\nbusy: {n} lifecycles of TKE's 4-bond pod in {wall:.0f} s; CPU per lifecycle beyond idle:")
    per = {name: (ns / 1e6 - rates[name] * wall) / n for name, ns in spent.items()}
    for name, ms in per.items():
        print(f"  {name:<20} {ms:7.1f} ms")
    print(f"  {'the pod':<20} {sum(per.values()):7.1f} ms")
    print(
        f"\npod creation -> Running: p50 {statistics.median(starts):.2f} s, p99 {p99(starts):.2f} s "
        f"(min {min(starts):.2f}, max {max(starts):.2f}, {n} pods)"
    )
    print(
        f"\nmemory at the end (TKE's guide: request {BUDGET_MEMORY_REQUEST_MI}Mi, "
        f"limit {BUDGET_MEMORY_LIMIT_MI}Mi per container):"
    )
    for name, (ws, rss) in mem.items():
        print(f"  {name:<20} working set {ws / 2**20:6.1f} MiB, RSS {rss / 2**20:6.1f} MiB")
    return {
        "idle_millicores": rates,
        "lifecycle_cpu_ms": per,
        "start_p50_s": statistics.median(starts),
        "start_p99_s": p99(starts),
        "memory_mib": {k: v[0] / 2**20 for k, v in mem.items()},
    }


def shipped_limits() -> dict[str, dict[str, str]]:
    pods = apiread.pods("k8s-app=rdma-cni", "kube-system")
    return {c["name"]: c.get("resources", {}).get("limits", {}) for c in pods[0]["spec"]["containers"]}


def manifest(sets: Sequence[str]) -> str:
    flags = [x for kv in sets for x in ("--set", kv)]
    return chart.template("--set", "image.tag=0.1.0", *flags, hooks=False) if flags else w.product_manifest()


def sweep(bins: Binaries, nd: Node, sets: Sequence[str], limits: Sequence[str], n: int) -> None:
    """TKE's pod's start and the agent's CPU per lifecycle at each rdma-agent CPU limit, one
    rolled-out DaemonSet after the other on the same cluster."""
    rows = []
    for limit in limits:
        w.apply(bins, manifest([*sets, f"resources.rdmaAgent.limits.cpu={limit}"]))
        w.rollout(bins)
        w.wait("capacity", lambda: w.node_capacity(bins, nd.name) == (8, 8), 120)
        one(bins, f"footprint-warmup-{limit}", True)
        cs = containers(nd)
        spent, _, starts = lifecycles(bins, nd, cs, n)
        agent = spent.get("rdma-agent", 0) / 1e6 / n
        rows.append((limit, statistics.median(starts), p99(starts), agent))
    print(f"\nrdma-agent's CPU limit against TKE's pod's creation -> Running ({n} pods each):")
    for limit, p50, top, agent in rows:
        print(f"  limit {limit:>5}: p50 {p50:.2f} s, p99 {top:.2f} s, agent CPU {agent:.0f} ms per lifecycle")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="footprint: %(message)s", stream=sys.stderr)
    p = argparse.ArgumentParser(prog="scripts/bench-footprint")
    p.add_argument("--idle", type=float, default=300, help="seconds of idle measured (default 300)")
    p.add_argument("--settle", type=float, default=30, help="seconds after Ready before the idle period")
    p.add_argument("--lifecycles", type=int, default=10)
    p.add_argument("--threads", action="store_true", help="where the idle CPU went, per thread")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a chart value on top of the shipped ones (e.g. resources.rdmaAgent.limits.cpu=250m)",
    )
    p.add_argument(
        "--agent-cpu-limits",
        default="",
        metavar="LIST",
        help="then the pod's start at each of these rdma-agent CPU limits (e.g. 1,500m,250m,100m,50m)",
    )
    a = p.parse_args(argv)
    with cluster.exclusive():
        try:
            cluster.up(1)
            bins = build.binaries()
            w.label_nodes(bins, 1)
            w.apply(bins, manifest(a.set))
            w.wait_ready(bins, "k8s-app=rdma-cni", 1, "kube-system", timeout=300)
            nd = Node(1)
            w.wait("capacity", lambda: w.node_capacity(bins, nd.name) == (8, 8), 120)
            one(bins, "footprint-warmup", True)  # the first pod pays for the cold caches: not counted
            time.sleep(a.settle)
            cs = containers(nd)
            rates = idle(cs, a.idle, a.threads)
            calls0 = call_cpu(nd)
            spent, wall, starts = lifecycles(bins, nd, cs, a.lifecycles)
            calls1 = call_cpu(nd)
            mem = {c.name: c.memory() for c in cs}
            figures = report(rates, a.idle, spent, wall, a.lifecycles, starts, mem, shipped_limits())
            print_call_cpu(calls0, calls1, a.lifecycles)
            if a.agent_cpu_limits:
                sweep(bins, nd, a.set, [x for x in a.agent_cpu_limits.split(",") if x], a.lifecycles)
        finally:
            cluster.down()
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
