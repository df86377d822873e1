"""``scripts/cluster``: build | up [--nodes N] | down | status | kubectl ARGS..."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

from cluster import build, cluster
from cluster.procs import StartError


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="cluster: %(message)s", stream=sys.stderr)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["kubectl"]:  # everything after it is kubectl's, flags included
        os.execvp("ip", cluster.kubectl_argv(build.binaries(), *argv[1:]))
    p = argparse.ArgumentParser(prog="scripts/cluster")
    sub = p.add_subparsers(dest="verb", required=True)
    sub.add_parser("build", help="build Kubernetes, etcd and containerd from Go modules (cached)")
    upp = sub.add_parser("up", help="start the cluster (sweeps a dead run first)")
    upp.add_argument("--nodes", type=int, default=1)
    sub.add_parser("down", help="remove everything up made")
    sub.add_parser("status")
    k = sub.add_parser("kubectl", help="kubectl as the cluster admin")
    k.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.verb == "build":
        t0 = time.monotonic()
        cluster.prepare()
        logging.info("build: %.0f s", time.monotonic() - t0)
        return 0
    if a.verb == "up":
        # a SIGTERM during up is a failure like any other: everything made so far goes
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            cluster.up(a.nodes)
        except (StartError, RuntimeError, ValueError) as e:
            print(f"cluster: up failed: {e}", file=sys.stderr)
            return 1
        return 0
    if a.verb == "down":
        cluster.down()
        return 0
    if a.verb == "status":
        print(cluster.status())
        return 0
    os.execvp("ip", cluster.kubectl_argv(build.binaries(), *a.args))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
