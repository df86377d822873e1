"""``scripts/bench-apicost``: what the product asks of the API server, counted from its audit log.

The test cluster's API server records every request of the product's identity (the DaemonSet's
ServiceAccount ``kube-system/rdma-cni``, which rdma-multus on the host, the device plugin and the
DRA driver all use) at Metadata level, and nobody else's (:func:`control_plane.audit_policy`). Each
component names itself in ``User-Agent`` (``rdma-multus/…``, ``rdma-dra-driver/…``). For each front
end (device plugin, DRA driver) in each RDMA mode asked (``--mode``: exclusive, shared or both) on
one node:

- requests per pod start and per pod delete, by component, verb and resource, one pod at a time
  (created, Running, deleted): in exclusive mode the seed pod (4 bonds, 4 GPUs; under DRA unchanged,
  through the DeviceClass's extendedResourceName); in shared mode (TKE's shared RDMA NIC: every pod
  a child of every bond with an address of its own, ``link: macvlan`` as this kernel has no IPVLAN)
  the pod of :func:`workloads.shared_deployment` (1 of ``tke-shared-rdma``) under the device plugin
  and the pod of conf/k8s/dra/examples/shared-claim.yaml (a claim for every bond) under DRA;
- requests per idle node-minute, watches excluded, once every pod's DEL is done;
- the watches the product opened from the phase's install to the end of its idle minute;
- the bytes of the node's ResourceSlices (DRA), as ``kubectl get -o json`` gives them.

The phases run in the order with the fewest DaemonSet rollouts (:func:`phases`: both modes take the
install and 3 rollouts); each phase's pods are gone, and the node's network exactly as before them,
before the next switch (install.sh refuses a mode switch while a pod holds a bond or an address).
It prints the table and the arithmetic for 1000 nodes at 50 pod starts/s, per front end and mode.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster import bench, build, cluster, control_plane
from cluster import dra as d
from cluster import invariants as inv
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import kubectl
from cluster.node import WORK, Node

PRODUCT_USER = "system:serviceaccount:kube-system:rdma-cni"
AUDIT_LOG = WORK / "logs" / control_plane.AUDIT_LOG
FLUSH = 2.5  # s: the audit backend batches for up to 1 s (--audit-log-batch-max-wait)
FRONT_ENDS = {"devicePlugin": "device plugin", "dra": "DRA driver"}  # the chart's frontEnd -> a label
MODES = ("exclusive", "shared")  # the chart's rdmaMode
DS = "k8s-app=rdma-cni"


def modes(arg: str) -> list[str]:
    """``--mode``: exclusive, shared or both."""
    return list(MODES) if arg == "both" else [arg]


def phases(mode_list: Sequence[str]) -> list[tuple[str, str]]:
    """(front end, mode) in the order of the fewest DaemonSet rollouts: the device plugin in each
    mode, then DRA in the modes reversed, so each switch changes one value (both modes: the install
    and 3 rollouts). DRA never hands back to the device plugin: ``kubectl apply`` would leave its
    DeviceClasses (one claims tke-shared-rdma as extendedResourceName) and its slices behind."""
    return [("devicePlugin", m) for m in mode_list] + [("dra", m) for m in reversed(mode_list)]


def label(front_end: str, mode: str) -> str:
    return f"{FRONT_ENDS[front_end]} ({mode})"


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
    """Reads the audit log from where the last read ended, and counts the watches opened in every
    read (``watches``: "component resource" -> count; a phase clears it at its start)."""

    def __init__(self, path: Path = AUDIT_LOG) -> None:
        self.path = path
        self.offset = 0
        self.watches: collections.Counter[str] = collections.Counter()

    def skip(self) -> None:
        """Up to now: the requests are not counted, the watches are."""
        self.read()

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
        self.watches.update(f"{r.agent} {r.resource}" for r in out.watches)
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
    """What one front end in one RDMA mode cost."""

    front_end: str  # the chart's frontEnd
    mode: str  # the chart's rdmaMode
    starts: dict[str, float]
    deletes: dict[str, float]
    idle_per_min: dict[str, float]
    watches: dict[str, int]  # opened from the phase's install to the end of its idle minute
    slice_bytes: int = 0

    @property
    def name(self) -> str:
        return label(self.front_end, self.mode)


def pod_doc(front_end: str, mode: str) -> Callable[[str], str]:
    """The pod a phase starts and deletes, by name."""
    if mode == "exclusive":
        return functools.partial(bench.pod_doc, rdma=True)
    return d.shared_claim_pod if front_end == "dra" else w.shared_pod


def offered(bins: Binaries, nd: Node, front_end: str, mode: str) -> bool:
    """The node's offer in the API as the mode makes it: kubelet's capacity and allocatable of the
    device plugin's resource (8 bonds, or shared mode's 1000), or the driver's slices in the mode's
    form."""
    if front_end == "dra":
        return d.published(bins, nd.name, mode)
    want = 1000 if mode == "shared" else 8
    return w.node_capacity(bins, nd.name) == (want, want)


def left(nd: Node) -> dict[str, list[str]]:
    """What the node still keeps for a pod (:func:`invariants.node_files`, the runtime's netns apart):
    rdma-macvlan's and rdma-ipvlan's records, over which install.sh refuses a mode switch, and the
    DRA driver's prepared claims and CDI specs."""
    return {k: v for k, v in inv.node_files(nd).items() if v and k != "netns"}


def install(bins: Binaries, nd: Node, front_end: str, mode: str, first: bool) -> None:
    """The product as FRONT_END in MODE, applied as kubectl users apply it; after the first, a
    rollout of its DaemonSet. Returns once the node's offer is in the API, where the scheduler reads
    it."""
    w.apply(bins, w.product_manifest(mode, front_end=front_end))
    if first:
        w.wait_ready(bins, DS, 1, "kube-system", timeout=300)
    else:
        w.rollout(bins)
    w.wait(f"{label(front_end, mode)} offered", functools.partial(offered, bins, nd, front_end, mode), 120)
    if front_end == "dra" and mode == "shared":
        w.apply(bins, d.shared_claim_template())
    if front_end == "dra" and mode == "exclusive":
        # as bench.switch_to_dra: kubelet keeps a stopped device plugin's resource registered for 5
        # minutes (allocatable 0); what a seed pod meets then is reported (seen: it runs through DRA)
        logging.info("a seed pod right after the switch to DRA: %s", bench.window_probe(bins))


def measure(
    bins: Binaries,
    nd: Node,
    clean: dict[str, object],
    front_end: str,
    mode: str,
    audit: AuditLog,
    pods: int,
    idle: float,
) -> FrontEnd:
    """One phase's pods, then its idle minute. ``clean``: the node's network without pods, which
    every DEL must have given back, its record removed, before the idle window (and the next mode
    switch)."""
    doc = pod_doc(front_end, mode)

    def exact() -> None:
        w.wait_exact([nd], {nd.name: clean})
        try:
            w.wait("nothing left on the node for a pod", lambda: not left(nd), 60)
        except TimeoutError as e:  # a finding, not the measurement's end: a refused switch says so
            logging.warning("%s", e)

    exact()  # the DEL of bench.window_probe's pod too
    starts, deletes = [], []
    for i in range(pods):
        pod = f"cost-{front_end.lower()}-{mode}-{i}"
        audit.skip()
        kubectl(bins, "create", "-f", "-", stdin=doc(pod))
        w.wait(f"{pod} Running", functools.partial(bench.running, bins, pod), 180, 0.05)
        starts.append(audit.read())
        kubectl(bins, "delete", "pod", pod, "--wait=true", timeout=180)
        deletes.append(audit.read())
    exact()
    audit.skip()
    time.sleep(idle)
    quiet = audit.read()
    idle_per_min = {k: v * 60 / (idle + 2 * FLUSH) for k, v in per([quiet]).items()}
    cost = FrontEnd(
        front_end, mode, per(starts), per(deletes), idle_per_min, dict(sorted(audit.watches.items()))
    )
    if front_end == "dra":
        cost.slice_bytes = slice_bytes(bins, nd.name)
    return cost


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


def in_order(results: Sequence[FrontEnd]) -> list[FrontEnd]:
    """As the table shows them, whatever order measured them: by mode, then front end."""
    return sorted(results, key=lambda fe: (MODES.index(fe.mode), list(FRONT_ENDS).index(fe.front_end)))


def table(results: Sequence[FrontEnd]) -> Iterator[str]:
    for fe in results:
        yield f"## {fe.name}"
        for what, counts in (("per pod start", fe.starts), ("per pod delete", fe.deletes),
                             ("per idle node-minute (no watches)", fe.idle_per_min)):  # fmt: skip
            total = sum(counts.values())
            yield f"{what}: {total:.2f}" + "".join(f"\n    {k}: {v:.2f}" for k, v in counts.items())
        yield "watches opened, from its install to the end of its idle minute: " + (
            json.dumps(fe.watches) if fe.watches else "none"
        )
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
    p.add_argument("--pods", type=int, default=5, help="pod starts and deletes per front end and mode")
    p.add_argument("--idle", type=float, default=60.0, help="seconds of idle node measured per phase")
    p.add_argument(
        "--mode", choices=(*MODES, "both"), default="both", help="the RDMA modes measured (default both)"
    )
    a = p.parse_args(argv)
    results = []
    with cluster.exclusive():
        try:
            cluster.up(1, audit=[PRODUCT_USER])
            bins, nd = build.binaries(), Node(1)
            w.label_nodes(bins, 1)
            audit = AuditLog()
            clean: dict[str, object] = {}
            for i, (front_end, mode) in enumerate(phases(modes(a.mode))):
                audit.skip()
                audit.watches.clear()
                logging.info("phase %d: %s", i + 1, label(front_end, mode))
                install(bins, nd, front_end, mode, first=i == 0)
                clean = clean or w.node_network(nd)
                results.append(measure(bins, nd, clean, front_end, mode, audit, a.pods, a.idle))
            watches = open_watches()
        finally:
            cluster.down()
    results = in_order(results)
    print("\n".join(table(results)))
    print("watches opened by the product over the run:", json.dumps(watches) if watches else "none")
    print("\n".join(at_scale(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
