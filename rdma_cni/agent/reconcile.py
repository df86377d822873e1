"""Give the host back its IPs for attachments whose pod netns is gone, without waiting for the runtime.

After a reboot or a crash nobody may call DEL for a long time (the runtime's GC runs late or never
on older runtimes), and the bond's IP stays recorded as "in the pod" while the pod is gone. The
agent, at start and then periodically, reads the rdma-macvlan state of every network it knows (and
rdma-ipvlan's: there a gone pod's DEL frees its addresses) and
runs the plugin's own DEL — through the protocol core, with an empty ``CNI_NETNS`` as containerd's
second DEL does — for each attachment whose recorded netns no longer exists (or is another netns
now: the inode differs). DEL is idempotent, so the runtime's own DEL later is harmless.

Networks come from the CNI config dir (``.conf``/``.conflist``/``.json``, and one level below it,
where rdma-multus keeps its delegates) or from explicit files. Safety: the check must see the node's
``/var/run/netns``; when the recorded netns' directory is not visible here at all, nothing is
touched (an agent container without that mount would otherwise take every pod's IP away).
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rdma_cni.agent.metrics import events as metrics_events
from rdma_cni.agent.plugins import Registry
from rdma_cni.cni import dispatch
from rdma_cni.cni.errors import CniError
from rdma_cni.net.netns import netns_inode
from rdma_cni.plugins.ipvlan.config import parse_del_config as parse_shared_del_config
from rdma_cni.plugins.macvlan.config import parse_del_config
from rdma_cni.state import NodeState

log = logging.getLogger("rdma-agent")

PLUGIN_TYPE = "rdma-macvlan"
# Shared mode's plugin: its records hold pod addresses; a DEL of a gone pod frees them.
PLUGIN_TYPES = (PLUGIN_TYPE, "rdma-ipvlan")
DEFAULT_CNI_PATH = "/opt/cni/bin"


@dataclass(frozen=True)
class Network:
    """One rdma-macvlan network config, as the plugin would receive it on stdin."""

    source: str
    conf: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.conf.get("name", ""))


def load_networks(path: str, types: tuple[str, ...] = (PLUGIN_TYPE,)) -> list[Network]:
    """The configs of plugins of ``types`` (rdma-macvlan's by default) in one file: a plain config,
    or each plugin of a conflist."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError) as exc:
        log.warning("reconcile: skipping %s: %s", path, exc)
        return []
    if not isinstance(data, dict):
        return []
    if isinstance(data.get("plugins"), list):
        out = []
        for plugin in data["plugins"]:
            if isinstance(plugin, dict) and plugin.get("type") in types:
                conf = dict(plugin, cniVersion=data.get("cniVersion", "1.0.0"), name=data.get("name", ""))
                out.append(Network(path, conf))
        return out
    return [Network(path, data)] if data.get("type") in types else []


def find_config_files(conf_dir: str) -> list[str]:
    found: list[str] = []
    for pattern in ("*.conf", "*.conflist", "*.json", "*/*.conf", "*/*.conflist", "*/*.json"):
        found.extend(glob.glob(os.path.join(conf_dir, pattern)))
    return sorted(set(found))


class Reconciler:
    def __init__(
        self,
        registry: Registry,
        confs: list[str] | None = None,
        conf_dir: str = "/etc/cni/net.d",
        cni_path: str = DEFAULT_CNI_PATH,
    ) -> None:
        self.registry = registry
        self.confs = list(confs or [])
        self.conf_dir = conf_dir
        self.cni_path = cni_path

    def networks(self, types: tuple[str, ...] = (PLUGIN_TYPE,)) -> list[Network]:
        """The rdma-macvlan networks (what the metrics read as exclusive mode), or those of ``types``."""
        files = self.confs or find_config_files(self.conf_dir)
        return [net for path in files for net in load_networks(path, types)]

    def run(self) -> None:
        """One pass over every known network of both plugins; runs in a forked worker of the agent."""
        restored = failed = 0
        for data_dir, nets in self._by_data_dir():
            done, bad = self._reconcile_dir(data_dir, nets)
            restored, failed = restored + done, failed + bad
        log.info("reconcile: %d attachment(s) with a vanished netns given back to the host", restored)
        metrics_events.report_reconcile(restored, failed)

    def _by_data_dir(self) -> Iterator[tuple[str, dict[str, Network]]]:
        groups: dict[str, dict[str, Network]] = {}
        for net in self.networks(PLUGIN_TYPES):
            kind = str(net.conf.get("type"))
            parse = parse_del_config if kind == PLUGIN_TYPE else parse_shared_del_config
            try:
                data_dir = parse(net.conf)[0].data_dir  # DEL's reading: only dataDir must be valid
            except CniError as exc:
                log.warning(
                    "reconcile: %s (%s) is not a valid %s config: %s", net.name, net.source, kind, exc.msg
                )
                continue
            groups.setdefault(data_dir, {}).setdefault(net.name, net)
        yield from groups.items()

    def _reconcile_dir(self, data_dir: str, nets: dict[str, Network]) -> tuple[int, int]:
        """(attachments given back, DELs that failed) for one data dir."""
        restored = failed = 0
        for rec in NodeState(data_dir).attachments():
            if not os.path.isdir(os.path.dirname(rec.netns) or "/nonexistent"):
                log.error(
                    "reconcile: %s/%s: %s is not visible to the agent; mount the node's netns dir "
                    "(nothing done)",
                    rec.container_id,
                    rec.ifname,
                    os.path.dirname(rec.netns),
                )
                continue
            if netns_inode(rec.netns) == rec.netns_inode:
                continue
            net = nets.get(rec.network) or next(iter(nets.values()))
            if self._delete(rec.container_id, rec.ifname, rec.netns, net):
                restored += 1
            else:
                failed += 1
        return restored, failed

    def _delete(self, container_id: str, ifname: str, netns: str, net: Network) -> bool:
        """The plugin's own DEL, as containerd's second DEL sends it (no netns, no prevResult)."""
        env = {
            "CNI_COMMAND": "DEL",
            "CNI_CONTAINERID": container_id,
            "CNI_IFNAME": ifname,
            "CNI_NETNS": "",
            "CNI_PATH": self.cni_path,
        }
        log.warning(
            "reconcile: %s/%s: netns %s is gone; running DEL (network %s)",
            container_id,
            ifname,
            netns,
            net.name,
        )
        kind = str(net.conf.get("type", PLUGIN_TYPE))
        stdout, code = dispatch.run(env, json.dumps(net.conf).encode(), self.registry.spec(kind))
        if code != 0:
            log.error("reconcile: DEL %s/%s failed: %s", container_id, ifname, stdout)
            return False
        return True
