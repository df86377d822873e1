"""``scripts/bench-apicost``: what the product asks of the API server, counted from its audit log.

The test cluster's API server records every request of the product's identity (the DaemonSet's
ServiceAccount ``kube-system/rdma-cni``, which rdma-multus on the host, the device plugin and the
DRA driver all use) at Metadata level, and nobody else's (:func:`control_plane.audit_policy`). Each
component names itself in ``User-Agent`` (``rdma-multus/…``, ``rdma-dra-driver/…``). For each front
end (device plugin, then DRA) on one node:

- requests per pod start and per pod delete, by component, verb and resource: the seed pod (4 bonds,
  4 GPUs), created, Running, deleted, one at a time, each request counted in the window between
  the create and the next pod's create;
- requests per idle node-minute, watches excluded, and the watches the product holds per node;
- the bytes of the node's ResourceSlices (DRA), as ``kubectl get -o json`` gives them.

It prints the table and the arithmetic for 1000 nodes at 50 pod starts/s.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster import bench, build, cluster, control_plane
from cluster import dra as d
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import kubectl
from cluster.node import WORK, Node

PRODUCT_USER = "system:serviceaccount:kube-system:rdma-cni"
AUDIT_LOG = WORK / "logs" / control_plane.AUDIT_LOG
FLUSH = 2.5  # s: the audit backend batches for up to 1 s (--audit-log-batch-max-wait)


@dataclass(frozen=True)
class Request:
    """One finished request of the product, as the audit log's ResponseComplete event says it."""

    agent: str  # the component: User-Agent up to "/"
    verb: str
    resource: str  # "pods/status", "resourceslices", ...

    @property
    def key(self) -> str:
        return f"{self.agent} {self.verb} {self.resource}"


@dataclass
class Window:
    """The requests of one stretch of time, and the watches opened in it."""

    requests: list[Request] = field(default_factory=list)
    watches: list[Request] = field(default_factory=list)


class AuditLog:
    """Reads the audit log from where the last read ended."""

    def __init__(self, path: Path = AUDIT_LOG) -> None:
        self.path = path
        self.offset = 0

    def skip(self) -> None:
        time.sleep(FLUSH)
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def read(self) -> Window:
        time.sleep(FLUSH)
        out = Window()
        if not self.path.exists():
            return out
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        for line in data[:end].splitlines():
            _add(out, json.loads(line))
        return out


def _add(out: Window, ev: dict[str, object]) -> None:
    ref = ev.get("objectRef") or {}
    assert isinstance(ref, dict)
    resource = str(ref.get("resource", "?")) + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    req = Request(str(ev.get("userAgent", "")).split("/")[0] or "?", str(ev.get("verb")), resource)
    if req.verb == "watch":
        if ev.get("stage") == "ResponseStarted":
            out.watches.append(req)
    elif ev.get("stage") == "ResponseComplete":
        out.requests.append(req)


def per(windows: Sequence[Window]) -> dict[str, float]:
    """Requests per window, by component/verb/resource, averaged over the windows."""
    counts: collections.Counter[str] = collections.Counter()
    for win in windows:
        counts.update(r.key for r in win.requests)
    return {k: v / len(windows) for k, v in sorted(counts.items())} if windows else {}


@dataclass
class FrontEnd:
    name: str
    starts: dict[str, float]
    deletes: dict[str, float]
    idle_per_min: dict[str, float]
    watches: int
    slice_bytes: int = 0


def measure(bins: Binaries, nd: Node, name: str, audit: AuditLog, pods: int, idle: float) -> FrontEnd:
    starts, deletes = [], []
    for i in range(pods):
        pod = f"cost-{name.split()[0].lower()}-{i}"
        audit.skip()
        kubectl(bins, "create", "-f", "-", stdin=bench.pod_doc(pod, True))
        w.wait(f"{pod} Running", functools.partial(bench.running, bins, pod), 180, 0.05)
        starts.append(audit.read())
        kubectl(bins, "delete", "pod", pod, "--wait=true", timeout=180)
        deletes.append(audit.read())
    audit.skip()
    time.sleep(idle)
    quiet = audit.read()
    idle_per_min = {k: v * 60 / (idle + 2 * FLUSH) for k, v in per([quiet]).items()}
    return FrontEnd(name, per(starts), per(deletes), idle_per_min, 0)


def open_watches(log: Path = AUDIT_LOG) -> dict[str, int]:
    """Watches the product opened over the whole run, by component and resource (each held open
    until the server ends it, then opened again: the count of concurrent ones is at most this)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in log.read_bytes().splitlines():
        ev = json.loads(line)
        if ev.get("verb") == "watch" and ev.get("stage") == "ResponseStarted":
            counts[f"{str(ev.get('userAgent', '')).split('/')[0]} {ev['objectRef'].get('resource')}"] += 1
    return dict(counts)


def slice_bytes(bins: Binaries, node: str) -> int:
    return sum(len(json.dumps(s, indent=4)) for s in d.slices(bins, node=node))


def table(results: Sequence[FrontEnd]) -> Iterator[str]:
    for fe in results:
        yield f"## {fe.name}"
        for what, counts in (("per pod start", fe.starts), ("per pod delete", fe.deletes),
                             ("per idle node-minute (no watches)", fe.idle_per_min)):  # fmt: skip
            total = sum(counts.values())
            yield f"{what}: {total:.2f}" + "".join(f"\n    {k}: {v:.2f}" for k, v in counts.items())
        if fe.slice_bytes:
            yield f"ResourceSlice bytes on the node: {fe.slice_bytes}"


def at_scale(results: Sequence[FrontEnd], nodes: int = 1000, starts_per_s: float = 50.0) -> Iterator[str]:
    for fe in results:
        start, delete = sum(fe.starts.values()), sum(fe.deletes.values())
        idle = sum(fe.idle_per_min.values()) * nodes / 60
        rate = (start + delete) * starts_per_s + idle
        yield (f"{fe.name}: {nodes} nodes, {starts_per_s:g} pod starts/s (and as many deletes): "
               f"{start:.2f} x {starts_per_s:g} + {delete:.2f} x {starts_per_s:g} + idle {idle:.2f} = "
               f"{rate:.1f} requests/s from the product")  # fmt: skip
        if fe.slice_bytes:
            mb = fe.slice_bytes * nodes / 1e6
            yield f"    ResourceSlices: {fe.slice_bytes} B/node x {nodes} = {mb:.1f} MB"


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="apicost: %(message)s", stream=sys.stderr)
    p = argparse.ArgumentParser(prog="scripts/bench-apicost")
    p.add_argument("--pods", type=int, default=5, help="pod starts and deletes per front end")
    p.add_argument("--idle", type=float, default=60.0, help="seconds of idle node measured")
    a = p.parse_args(argv)
    results = []
    with cluster.exclusive():
        try:
            cluster.up(1, audit=[PRODUCT_USER])
            bins, nd = build.binaries(), Node(1)
            w.label_nodes(bins, 1)
            w.apply(bins, w.product_manifest())
            w.wait_ready(bins, "k8s-app=rdma-cni", 1, "kube-system", timeout=300)
            w.wait("allocatable in the API", lambda: w.node_capacity(bins, nd.name) == (8, 8), 120)
            audit = AuditLog()
            results.append(measure(bins, nd, "device plugin", audit, a.pods, a.idle))
            bench.switch_to_dra(bins, nd)
            dra = measure(bins, nd, "DRA driver", audit, a.pods, a.idle)
            dra.slice_bytes = slice_bytes(bins, nd.name)
            results.append(dra)
            watches = open_watches()
        finally:
            cluster.down()
    print("\n".join(table(results)))
    print("watches opened by the product over the run:", json.dumps(watches) if watches else "none")
    print("\n".join(at_scale(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
