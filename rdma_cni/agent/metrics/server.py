"""The agent's metrics process: ``/metrics`` in Prometheus's text format, and the call counts.

Why a process of its own (forked by the agent, replaced when it dies, killed with it): the agent's
parent forks workers all the time, and prometheus_client's HTTP server serves from threads. A
thread in the parent would make every fork a copy of a multi-threaded process (a lock held by the
server thread at fork time stays locked forever in the worker: logging's, the registry's), and a
worker must start with one thread (``worker.unfit_for_another_call``). Serving from the parent's
own loop instead would put a scrape's reads (sysfs, netlink, state: ~10-30 ms on 8 bonds) between
the parent and its job of replacing workers. This process never forks, so its threads are safe;
it shares the agent's warm pages, imports prometheus_client only here (the parent and workers never
load it), and runs at nice 19, so that on a saturated node a scrape waits for the CNI calls, not the
other way round. Measured (scripts/bench --only warm-c --scrape-every 100, 8 simulated mlx5 devices
with their counter files, ~420 samples, 52 KB): a scrape costs ~18 ms of CPU (about half of it
prometheus_client's text rendering); on this 2-CPU machine at load 10-19 it took 0.15-0.7 s of
wall time at nice 19, and warm p50 scraped/not over three runs (30, 60, 60 cycles) was ADD
0.98-1.18, CHECK 0.87-1.37, DEL 1.07-1.19, VERSION 0.62-0.98: within that loaded machine's noise,
at 10 scrapes a second (Prometheus's default is one per 15-60 s). Raising the
niceness needs no privilege (SCHED_IDLE would need CAP_SYS_NICE to undo and gives nearly the same
weight: 3 against nice 19's 15).

The counts of calls arrive as datagrams (:mod:`rdma_cni.agent.metrics.events`) from the workers
and reconcile jobs; everything else is read from the node at scrape time (:mod:`node`).
Calls that ran in-process because no agent answered are not counted: they never pass here (the
refusals the agent itself answered are, in ``rdma_cni_agent_refused_calls_total``).
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector

from rdma_cni.agent.metrics import events as metrics_events
from rdma_cni.agent.metrics.address import url_of
from rdma_cni.agent.metrics.events import Call, Event, Reconcile, Refused

log = logging.getLogger("rdma-agent")

# A warm ADD is ~5 ms, CHECK ~2.5, DEL ~28 (bound by the kernel's RCU grace periods), VERSION ~1:
# buckets every millisecond or two up to 5 ms, then a few per decade to 200 ms, then a cold tail.
BUCKETS = (0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04,
           0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0)
NICE = 19


class CallMetrics:
    """The counters the events feed; one instance per metrics process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "rdma_cni_cni_calls", "CNI calls served by the agent's workers", ["plugin", "verb", "result"],
            registry=registry,
        )
        self.errors = Counter(
            "rdma_cni_cni_call_errors", "CNI calls that failed, by CNI error code",
            ["plugin", "verb", "code"], registry=registry,
        )
        self.duration = Histogram(
            "rdma_cni_cni_call_duration_seconds", "Time from the client's GO to the answer",
            ["plugin", "verb"], buckets=BUCKETS, registry=registry,
        )
        self.cpu = Counter(
            "rdma_cni_cni_call_cpu_seconds",
            "CPU the agent's workers spent on CNI calls: part=plugin (our code), delegates (the programs "
            "a call ran, e.g. the cluster network's plugin), kube_api (Kubernetes API requests)",
            ["plugin", "verb", "part"], registry=registry,
        )
        self.reconcile_runs = Counter(
            "rdma_cni_reconcile_runs", "Reconcile passes completed", registry=registry
        )
        self.reconcile_repairs = Counter(
            "rdma_cni_reconcile_repairs",
            "Attachments whose netns was gone given back to the host by reconcile", registry=registry,
        )
        self.reconcile_failures = Counter(
            "rdma_cni_reconcile_failures", "Reconcile DELs that failed", registry=registry
        )
        self.refused = Counter(
            "rdma_cni_agent_refused_calls",
            "Calls the agent refused (every worker busy, or one it cannot run): they ran in-process",
            registry=registry,
        )
        self.malformed = Counter(
            "rdma_cni_metrics_malformed_events", "Event datagrams that could not be decoded",
            registry=registry,
        )

    def apply(self, event: Event | None) -> None:
        if isinstance(event, Call):
            self.calls.labels(event.plugin, event.verb, event.result).inc()
            if event.code:
                self.errors.labels(event.plugin, event.verb, str(event.code)).inc()
            self.duration.labels(event.plugin, event.verb).observe(event.seconds)
            if event.cpu is not None:
                for part in ("plugin", "delegates", "kube_api"):
                    self.cpu.labels(event.plugin, event.verb, part).inc(getattr(event.cpu, part))
        elif isinstance(event, Reconcile):
            self.reconcile_runs.inc()
            self.reconcile_repairs.inc(event.repaired)
            self.reconcile_failures.inc(event.failed)
        elif isinstance(event, Refused):
            self.refused.inc()
        else:
            self.malformed.inc()


def _http_server(listener: socket.socket, registry: CollectorRegistry) -> ThreadingHTTPServer:
    class Server(ThreadingHTTPServer):
        address_family = listener.family
        daemon_threads = True

    httpd = Server(listener.getsockname()[:2], MetricsHandler.factory(registry), bind_and_activate=False)
    httpd.socket.close()
    httpd.socket = listener  # bound by the agent at start: a bad address fails the agent, not this
    return httpd


def serve(listener: socket.socket, events: socket.socket, collector: Collector) -> None:
    """The metrics process's body: HTTP in a thread, events in this one; returns never."""
    gc.enable()  # the agent's forks run without the collector; this process lives as long as it does
    try:
        os.nice(NICE)
    except OSError as exc:
        log.info("metrics: cannot lower priority: %s", exc)
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=False)
    calls = CallMetrics(registry)
    registry.register(collector)
    httpd = _http_server(listener, registry)
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    log.info("metrics: serving %s (pid %d)", url_of(listener), os.getpid())
    while True:
        calls.apply(metrics_events.decode(events.recv(metrics_events.MAX_EVENT)))
