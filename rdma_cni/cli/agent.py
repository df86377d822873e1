"""``rdma-agent``: the node daemon that answers CNI calls warm (see :mod:`rdma_cni.agent`).

rdma-agent [--socket /run/rdma-cni/agent.sock] [--reconcile-interval 60] [--conf FILE ...]
           [--metrics-address HOST:PORT]
rdma-agent --probe [--socket ...] [--probe-wait S]   exit 0 when an agent answers a CNI VERSION call
                                                    on the socket (asked again for up to S seconds)
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from rdma_cni.agent import client
from rdma_cni.agent.handover import wait_for_previous
from rdma_cni.agent.metrics import events as metrics_events
from rdma_cni.agent.metrics.address import listen, url_of
from rdma_cni.agent.plugins import KNOWN
from rdma_cni.agent.server import PREFORK, QUEUE_WAIT, WARM_WORKERS, Agent, AgentConfig
from rdma_cni.retry import look_until

FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rdma-agent", description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=client.DEFAULT_SOCKET, help="unix socket to serve (mode 0600)")
    ap.add_argument(
        "--reconcile-interval",
        type=float,
        default=60.0,
        help="seconds between reconcile runs (0: only at start, -1: never)",
    )
    ap.add_argument(
        "--conf",
        action="append",
        default=[],
        help="network config (.conf/.conflist) whose rdma-macvlan attachments to reconcile; "
        "default: every one in --conf-dir",
    )
    ap.add_argument("--conf-dir", default="/etc/cni/net.d")
    ap.add_argument("--cni-path", default="/opt/cni/bin", help="CNI_PATH for the DELs reconcile runs (IPAM)")
    ap.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="NAME=MODULE:ATTR",
        help="serve another plugin spec (default: rdma-macvlan and rdma-multus)",
    )
    ap.add_argument("--max-workers", type=int, default=32, help="calls served at once; more run in-process")
    ap.add_argument(
        "--prefork", type=int, default=PREFORK,
        help="idle workers kept ready when no call runs (a burst beyond them waits for one: --queue-wait)",
    )
    ap.add_argument(
        "--warm-workers", type=int, default=WARM_WORKERS,
        help="how many idle workers may hold the pages calls write as their own (prefaulted or kept "
        "from a call, ~6 MiB each); the other idle workers share all pages with the agent (~1.6 MiB)",
    )
    ap.add_argument(
        "--calls-per-worker",
        type=int,
        default=64,
        help="calls a worker serves (each from a clean slate) before a fresh fork replaces it; 1: a "
        "fresh fork for every call",
    )
    ap.add_argument(
        "--trim-after",
        type=float,
        default=3.0,
        help="seconds idle workers beyond --prefork (left from a burst of calls) are kept for the next",
    )
    ap.add_argument(
        "--queue-wait",
        type=float,
        default=QUEUE_WAIT,
        help="seconds a call that finds every worker busy waits for one of them before one more worker "
        "is forked for it (at once when a busy worker waits on a plugin it ran); 0: keep a spare idle "
        "worker while calls run instead",
    )
    ap.add_argument(
        "--no-prefault",
        dest="prefault",
        action="store_false",
        help="idle workers do not take their copy-on-write faults ahead of a call (less memory, "
        "slower calls)",
    )
    ap.add_argument(
        "--metrics-address",
        default="",
        metavar="HOST:PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (e.g. 0.0.0.0:9513); default: none",
    )
    ap.add_argument("--log-file", default="")
    ap.add_argument("--log-level", default="info")
    ap.add_argument(
        "--probe",
        action="store_true",
        help="do not serve: ask the agent on --socket for rdma-macvlan's VERSION and exit 0 if it "
        "answered (a readiness probe that goes through the whole protocol, worker fork included)",
    )
    ap.add_argument("--probe-timeout", type=float, default=5.0, help="seconds the probe waits for READY")
    ap.add_argument(
        "--probe-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="while no agent answers, ask again every 0.2 s for up to SECONDS (kubelet runs the "
        "readiness probe as the container starts, before the agent listens)",
    )
    return ap.parse_args(argv)


PROBE_PLUGIN = "rdma-macvlan"


def probe(socket_path: str, timeout: float) -> tuple[bool, str]:
    """A VERSION call through the socket, answered by a forked worker: a socket file alone would not
    tell a wedged or code-mismatched agent from a serving one (both make every call fall back)."""
    answer = client.forward(
        PROBE_PLUGIN, {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}', timeout, socket_path
    )
    if answer is None:
        return False, f"no agent answered on {socket_path} (absent, refusing, or not READY in {timeout:g} s)"
    if answer.code != 0 or "supportedVersions" not in answer.stdout:
        detail = answer.stdout.strip()
        return False, f"agent on {socket_path} answered VERSION with exit {answer.code}: {detail}"
    return True, f"agent on {socket_path} serves {PROBE_PLUGIN}"


PROBE_AGAIN_SECONDS = 0.2


def probe_until(socket_path: str, timeout: float, wait: float) -> tuple[bool, str]:
    """:func:`probe`, asked again while it fails, for up to ``wait`` seconds. Why: kubelet runs a
    readiness probe that has no result yet as soon as the container runs, ~1 s before the agent
    listens; a probe that answered at once left the pod not Ready until its next period (10 s),
    which a rolling update waits for on every node. Connecting to an absent socket costs nothing."""
    return look_until(lambda: probe(socket_path, timeout), lambda seen: seen[0], wait, PROBE_AGAIN_SECONDS)


def _configure_logging(log_file: str, level: str) -> None:
    logger = logging.getLogger("rdma-agent")
    logger.setLevel(level.upper())
    logger.propagate = False
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)


METRICS_FILE = "agent-metrics.json"  # beside the socket: where cni-tool doctor finds the endpoint
METRICS_BIND_WAIT = 5.0  # seconds a busy metrics port is tried again (the previous agent leaving)


def _listen_or_none(address: str) -> socket.socket | None:
    """listen(), or None while the port is busy: the previous agent (a build that did not set
    SO_REUSEPORT) may keep its listener for the moment between letting its lock go and exiting."""
    import errno

    try:
        return listen(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return None
        raise


def _metrics(agent: Agent, reconciler: object, address: str) -> dict[str, object]:
    """Bind the metrics address before anything is published (a bad one stops the agent with the
    reason) and give the agent the body of its metrics process. Returns the endpoint's record."""
    import os

    from rdma_cni.agent.reconcile import Reconciler  # lazy: see main()

    assert isinstance(reconciler, Reconciler)
    try:
        found = look_until(lambda: _listen_or_none(address), lambda x: x is not None, METRICS_BIND_WAIT, 0.1)
        listener = found if found is not None else listen(address)
    except ValueError as exc:
        sys.exit(f"rdma-agent: {exc}")
    except OSError as exc:
        sys.exit(f"rdma-agent: --metrics-address {address}: cannot listen: {exc}; choose a free port")
    events = metrics_events.open_channel()

    def body() -> None:
        # Imported here, in the metrics process only: the parent and its workers never load it
        # (prometheus_client and the node readers: ~140 ms and their pages, python -X importtime).
        from rdma_cni.agent.metrics.node import NodeCollector, Sources, sources_of
        from rdma_cni.agent.metrics.server import serve

        def sources() -> Sources:
            return sources_of((n.conf for n in reconciler.networks()), reconciler.conf_dir)

        serve(listener, events, NodeCollector(sources))

    agent.metrics = body
    agent.metrics_sockets = [listener, events]
    return {"address": address, "url": url_of(listener), "pid": os.getpid()}


def _note_metrics(record: dict[str, object], socket_path: str) -> None:
    """The endpoint beside the socket, for cni-tool doctor (which cannot know the agent's flags)."""
    import os

    from rdma_cni import durable  # lazy: ~5 ms (python -X importtime) that --probe never needs

    path = os.path.join(os.path.dirname(os.path.abspath(socket_path)), METRICS_FILE)
    durable.atomic_write_json(path, record, mode=0o644, dir_mode=0o755, sync=False)


def _wait_for_previous(socket_path: str, log: logging.Logger) -> None:
    """A rolling update's new agent, warm, waits for the node's running one to stop (handover.py)."""

    def note() -> None:
        log.info("another rdma-agent serves %s: waiting until it and its calls end", socket_path)

    waited = wait_for_previous(socket_path, note)
    if waited:
        log.info("the previous rdma-agent ended %.1f s later: taking over %s", waited, socket_path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.probe:
        ok, why = probe_until(args.socket, args.probe_timeout, args.probe_wait)
        print(f"rdma-agent probe: {why}", file=sys.stderr)
        sys.exit(0 if ok else 1)
    _configure_logging(args.log_file, args.log_level)
    log = logging.getLogger("rdma-agent")
    targets = None
    if args.plugin:
        targets = dict(KNOWN)
        for item in args.plugin:
            name, sep, target = item.partition("=")
            if not sep or ":" not in target:
                sys.exit(f"rdma-agent: --plugin {item!r}: expected NAME=MODULE:ATTR")
            targets[name] = target
    # Here, not at the top: reconcile (the plugins' configs and state) costs ~35 ms (python -X
    # importtime) that --probe, which kubelet runs every few seconds, never needs.
    from rdma_cni.agent.reconcile import Reconciler

    config = AgentConfig(
        socket_path=args.socket,
        reconcile_interval=args.reconcile_interval,
        max_workers=args.max_workers,
        prefork=args.prefork,
        warm_workers=max(0, args.warm_workers),
        prefault=args.prefault,
        calls_per_worker=max(1, args.calls_per_worker),
        trim_after=max(0.0, args.trim_after),
        queue_wait=max(0.0, args.queue_wait),
        targets=targets,
    )
    agent = Agent(config)
    reconciler = Reconciler(agent.registry, args.conf, args.conf_dir, args.cni_path)
    agent.reconcile = reconciler.run
    served = agent.warm_up()
    _wait_for_previous(args.socket, log)
    metrics = _metrics(agent, reconciler, args.metrics_address) if args.metrics_address else None
    try:
        agent.bind()
    except (RuntimeError, OSError) as exc:
        sys.exit(f"rdma-agent: cannot serve {args.socket}: {exc}")
    if metrics is not None:
        _note_metrics(metrics, args.socket)
    log.info("serving %s on %s", ", ".join(served) or "no plugin", args.socket)
    agent.serve()


if __name__ == "__main__":
    main()
