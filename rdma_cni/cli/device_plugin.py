"""``rdma-device-plugin``: the kubelet device plugin for ``tke.cloud.tencent.com/tke-shared-rdma``
(exclusive, or TKE's shared mode) and for pools of HCAs, Mellanox's ``config.json`` included.

    rdma-device-plugin [--config FILE] [--kubelet-root-dir DIR] [--sysfs-root DIR] [--dev-root DIR]
                       [--cni-conf FILE] [--resource-name NAME] [--log-file FILE] [--log-level LEVEL]
                       [--device-plugin-dir DIR] [--pod-resources-dir DIR] [--rescan-interval S]
                       [--run-dir DIR] [--cdi [--cdi-dir DIR]] [--pod-status FILE]

Runs in the node's network namespace (hostNetwork) until SIGTERM/SIGINT, then removes its socket.
Exit codes: 0 after a signal, 2 for a bad config (one sentence naming the key and the fix), 1 when
the node cannot run it (the kernel's RDMA netns mode is not ``shared``, or the first scan failed).

``--cdi`` (off by default, as Mellanox's ``--use-cdi``; needs a runtime with CDI on): Allocate answers
CDI device names from one spec per pool in ``--cdi-dir`` (default /var/run/cdi) instead of device
nodes (:mod:`rdma_cni.deviceplugin.cdi` says what the specs hold and why). Flags only, not config keys:
whether the runtime does CDI is the node's matter, not the pools'.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

from rdma_cni import log as logs
from rdma_cni.deviceplugin.cdi import CdiConfig, cdi_config
from rdma_cni.devices.cdi import SPEC_DIR
from rdma_cni.devices.config import (
    ConfigError,
    NetnsModeError,
    PluginConfig,
    flag_name,
    load_config,
    require_shared_netns,
)
from rdma_cni.dra.names import DRIVER as DRA_DRIVER

log = logging.getLogger("rdma_cni.device_plugin")

# flag -> PluginConfig field: what the command line may set (None: not given, the file or default wins).
FLAGS = {
    "--kubelet-root-dir": "kubelet_root_dir",
    "--device-plugin-dir": "device_plugin_dir",
    "--pod-resources-dir": "pod_resources_dir",
    "--sysfs-root": "sysfs_root",
    "--dev-root": "dev_root",
    "--cni-conf": "cni_conf",
    "--resource-name": "resource_name",
    "--rescan-interval": "rescan_interval_s",
    "--run-dir": "run_dir",
    "--device-info-dir": "device_info_dir",
    "--log-file": "log_file",
    "--log-level": "log_level",
}
NUMBERS = {"rescan_interval_s"}
HELP = {
    "kubelet_root_dir": "kubelet's --root-dir (TKE's guide's KubeletRootDir; default /var/lib/kubelet)",
    "device_plugin_dir": "kubelet's device-plugin socket dir (default <kubelet-root-dir>/device-plugins; "
    "kubelet keeps it under /var/lib/kubelet even when its --root-dir moves)",
    "pod_resources_dir": "PodResources socket dir (default <kubelet-root-dir>/pod-resources)",
    "sysfs_root": "where sysfs is (default /sys)",
    "dev_root": "where the /dev/infiniband nodes are (default /dev)",
    "cni_conf": "the delegate config (tke-rdma-macvlan or tke-rdma-ipvlan) whose masters, dataDir and runDir "
    "the plugin follows",
    "resource_name": "extended resource of the one pool (default tke.cloud.tencent.com/tke-shared-rdma; "
    "a config listing pools names its own)",
    "rescan_interval_s": "seconds between sysfs rescans (port state has no event; default 0.5)",
    "run_dir": "where status.json goes (<run-dir>/device-plugin/; default the CNI config's runDir)",
    "device_info_dir": "where the NPWG device-info files for Multus go (default "
    "/var/run/k8s.cni.cncf.io/devinfo/dp, where Multus reads them; \"\" writes none)",
    "log_file": "log file (logs also go to stderr)",
    "log_level": "debug, info, warning or error",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rdma-device-plugin", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="config file, YAML or JSON (also Mellanox's "
                    "k8s-rdma-shared-dev-plugin config.json, as it is); flags win over it")
    for flag, key in FLAGS.items():
        aliases = [flag_name(key)] if flag_name(key) != flag else []  # --rescan-interval-s, as errors say
        ap.add_argument(flag, *aliases, dest=key, default=None, help=HELP[key])
    ap.add_argument("--cdi", action="store_true", help="Allocate answers CDI device names (one spec per "
                    "pool in --cdi-dir) instead of device nodes; needs CDI in the runtime "
                    "(containerd >= 2.0, or 1.7 with enable_cdi)")
    ap.add_argument("--cdi-dir", default=None, help=f"where --cdi writes its specs (default {SPEC_DIR})")
    ap.add_argument("--pod-status", default="", metavar="FILE",
                    help="also write this process's status.json here (a directory of its pod's own: the "
                    "node's status.json is the newest plugin's while a rolling update runs two)")
    return ap.parse_args(argv)


def cdi_of(args: argparse.Namespace, cfg: PluginConfig) -> CdiConfig | None:
    """``--cdi`` checked against the pools (ConfigError), or None without it. The DRA driver's CDI vendor
    is reserved: its start-up sweep removes spec files of its kind it did not write."""
    if not args.cdi:
        if args.cdi_dir is not None:
            raise ConfigError("--cdi-dir", args.cdi_dir, "it means something only with --cdi; "
                              "add --cdi or drop --cdi-dir")
        return None
    return cdi_config(cfg.pool_specs(), args.cdi_dir or SPEC_DIR, reserved_vendors=(DRA_DRIVER,))


def flags_of(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that were given, by config key. A number flag that reads as one becomes a float;
    anything else stays text, so load_config's own check names the flag and the fix."""
    out: dict[str, Any] = {}
    for key in FLAGS.values():
        value = getattr(args, key)
        if value is None:
            continue
        if key in NUMBERS:
            with contextlib.suppress(ValueError):
                value = float(value)
        out[key] = value
    return out


def _fail(code: int, text: str) -> None:
    sys.stderr.write(f"rdma-device-plugin: {text}\n")
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        cfg: PluginConfig = load_config(flags_of(args), args.config)
        cdi = cdi_of(args, cfg)
    except ConfigError as e:
        _fail(2, str(e))
    logs.configure(cfg.log_file, cfg.log_level, stderr_level=cfg.log_level)
    try:
        require_shared_netns(cfg)
    except NetnsModeError as e:
        _fail(1, str(e))
    # gRPC's C core logs connection churn (every kubelet restart) at INFO to stderr; our log says
    # what happened in one line. An explicit GRPC_VERBOSITY still wins. Set before grpc loads, so
    # the gRPC layer (~140 ms, python -X importtime, which a bad config never pays) is imported here.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    from rdma_cni.deviceplugin import daemon

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        daemon.run(cfg, stop, cdi, args.pod_status)
    except ConfigError as e:  # the first scan found pools the config cannot mean (an HCA in two)
        _fail(2, str(e))
    except Exception as e:  # the first scan: a node we cannot read at all
        log.exception("device plugin stopped")
        _fail(1, f"stopped: {e}")
    log.info("stopped on signal; socket removed")
    sys.exit(0)


if __name__ == "__main__":
    main()
