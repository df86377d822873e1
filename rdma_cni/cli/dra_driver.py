"""``rdma-dra-driver``: the DRA kubelet plugin for driver ``rdma.tke.cloud.tencent.com``, the same RDMA
devices the device plugin serves, through Dynamic Resource Allocation: the bonds of ``masters``, or,
when ``--config`` lists pools (``pools:``, or Mellanox's ``config.json`` as it is), every device of
every pool, each named by its pool (:mod:`rdma_cni.dra.table`).

    rdma-dra-driver [--config FILE] [--kubelet-root-dir DIR] [--sysfs-root DIR] [--dev-root DIR]
                    [--cni-conf FILE] [--node-name NAME] [--kubeconfig FILE] [--cdi-dir DIR]
                    [--rescan-interval S] [--log-file FILE] [--log-level LEVEL]

Runs in the node's network namespace (hostNetwork) until SIGTERM/SIGINT, then removes its sockets.
The node name defaults to $NODE_NAME (the downward API), the API server to the pod's ServiceAccount.
Exit codes: 0 after a signal, 2 for a bad config or flag (one sentence naming it and the fix; also an
HCA of an exclusive pool that another pool selects, as rdma-device-plugin refuses it), 1 when the node
cannot run it (the kernel's RDMA netns mode is not ``shared``, or the first scan failed).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
from typing import Any, NoReturn

from rdma_cni import log as logs
from rdma_cni.cni.errors import CniError
from rdma_cni.devices import cdi, config
from rdma_cni.devices.config import ConfigError, NetnsModeError, load_config, require_shared_netns
from rdma_cni.kube import kubeconfig

log = logging.getLogger("rdma_cni.dra_driver")

DEFAULT_LOG_FILE = "/var/log/rdma-cni/rdma-dra-driver.log"
# flag -> PluginConfig field, as rdma-device-plugin names them.
FLAGS = {
    "--kubelet-root-dir": "kubelet_root_dir",
    "--sysfs-root": "sysfs_root",
    "--dev-root": "dev_root",
    "--cni-conf": "cni_conf",
    "--rescan-interval": "rescan_interval_s",
    "--log-file": "log_file",
    "--log-level": "log_level",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rdma-dra-driver", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="the device plugin's config file (YAML or JSON): "
                    "mode, sharedCount, pools, env switches, kubeletRootDir ..., or Mellanox's "
                    "config.json; flags win over it")
    for flag, key in FLAGS.items():
        ap.add_argument(flag, dest=key, default=None)
    ap.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                    help="this node's name: the pool and the slices' node (default $NODE_NAME)")
    ap.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: the pod's ServiceAccount)")
    ap.add_argument("--cdi-dir", default=cdi.SPEC_DIR, help=f"where CDI specs go (default {cdi.SPEC_DIR})")
    return ap.parse_args(argv)


def flags_of(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that were given, by config key; the rescan interval a float when it reads as one
    (anything else stays text, so load_config's own check names the flag and the fix)."""
    out: dict[str, Any] = {}
    for key in FLAGS.values():
        value = getattr(args, key)
        if value is not None and key == "rescan_interval_s":
            with contextlib.suppress(ValueError):
                value = float(value)
        if value is not None:
            out[key] = value
    return out


def _fail(code: int, text: str) -> NoReturn:
    sys.stderr.write(f"rdma-dra-driver: {text}\n")
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    flags = flags_of(args)
    try:
        cfg = load_config(flags, args.config)
    except ConfigError as e:
        _fail(2, str(e))
    if cfg.log_file == config.DEFAULT_LOG_FILE:  # the device plugin's default: not this program's log
        cfg = dataclasses.replace(cfg, log_file=DEFAULT_LOG_FILE)
    if not args.node_name:
        _fail(2, "--node-name is empty: set NODE_NAME from the downward API (spec.nodeName) "
                 "or give --node-name")
    logs.configure(cfg.log_file, cfg.log_level, stderr_level=cfg.log_level)
    try:
        require_shared_netns(cfg)
    except NetnsModeError as e:
        _fail(1, str(e))
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # as rdma-device-plugin: our log says what happened
    # The gRPC layer is imported after the checks above, as rdma-device-plugin does: a bad flag
    # never pays for it.
    from rdma_cni.dra import daemon
    from rdma_cni.dra.kubeapi import ResourceClient, in_cluster

    try:
        api = kubeconfig.load(args.kubeconfig) if args.kubeconfig else in_cluster(dict(os.environ))
    except CniError as e:
        _fail(2, e.msg)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    paths = daemon.DriverPaths.under(cfg.kubelet_root_dir, args.cdi_dir)
    try:
        daemon.run(cfg, paths, args.node_name, ResourceClient(api), stop)
    except ConfigError as e:  # pools that overlap as the device plugin refuses them
        _fail(2, str(e))
    except Exception as e:  # the first scan: a node we cannot read at all
        log.exception("DRA driver stopped")
        _fail(1, f"stopped: {e}")
    log.info("stopped on signal; sockets removed")
    sys.exit(0)


if __name__ == "__main__":
    main()
