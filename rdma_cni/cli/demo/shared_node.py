"""Step 1 of the demo in TKE's shared RDMA NIC mode: the exclusive demo's node (:class:`.node.Demo`)
with what differs on a node in shared mode.

* rdma-ipvlan's delegate config (``conf/shared-mode``) instead of rdma-macvlan's, with ``link:
  macvlan``: this kernel has no IPVLAN (the VM test runs the ``ipvlan`` default);
* rdma-device-plugin started with ``mode: shared``: ``sharedCount`` (1000) virtual devices of
  ``tke-shared-rdma``;
* two pods, each with its own name, UID and netns, sharing every bond.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

from rdma_cni.cli.demo.installed import Demo
from rdma_cni.cli.demo.node import POD, RESOURCE, bond_addr
from rdma_cni.cli.demo.shell import REPO, run
from rdma_cni.cli.tool import container_id_for
from rdma_cni.cli.tool_gids import collect

SHARED_COUNT = 1000
NETWORK = "tke-rdma-ipvlan"
PODS = 2
GID_ENV = ("NCCL_IB_GID_INDEX", "UCX_IB_GID_INDEX")


class SharedDemo(Demo):
    """The exclusive demo's node with shared mode's configs, device plugin and two pods."""

    def __init__(self, bonds: int, bundle: str, mode: str = "vpc-cni") -> None:
        super().__init__(bonds, bonds, bundle, mode)
        self.pods = [f"{self.pods_prefix}{i}" for i in range(PODS)]
        self.pod_names = [f"rdma-demo-{i}" for i in range(PODS)]
        self.pod_uids = [str(uuid.uuid4()) for _ in range(PODS)]
        self.delegate = self.conf_dir / "rdma-multus.d" / f"{NETWORK}.conf"
        self.data_dir = self.tmp / "ipvlan-state"

    @property
    def networks(self) -> str:
        return f"{self.default_network},{NETWORK}"

    def device_plugin_config(self) -> list[str]:
        path = self.tmp / "rdma-device-plugin.yaml"
        path.write_text(f"mode: shared\nsharedCount: {SHARED_COUNT}\n")
        return ["--config", str(path), "--cni-conf", str(self.delegate)]

    def install_plugins(self) -> None:
        super().install_plugins()
        if not self.bundle:  # the bundle's install.sh links rdma-ipvlan itself
            path = self.bin_dir / "rdma-ipvlan"
            path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rdma_cni.cli.ipvlan "$@"\n')
            path.chmod(0o755)

    def write_configs(self) -> None:
        """The exclusive demo's configs with rdma-ipvlan's delegate in place of rdma-macvlan's (a
        node runs one mode); only paths and the link type differ from conf/shared-mode."""
        super().write_configs()
        (self.conf_dir / "rdma-multus.d" / "tke-rdma-macvlan.conf").unlink()
        conf = json.loads((REPO / "conf" / "shared-mode" / "rdma-multus.d" / f"{NETWORK}.conf").read_text())
        conf.update(
            link="macvlan",
            # The switch's own addresses: the demo's bonds route nothing through them (a gateway of a
            # bond's route the plugin would skip by itself), so the operator names them.
            exclude=[bond_addr(i)[1].split("/")[0] for i in range(len(self.bonds))],
            dataDir=str(self.data_dir),
            runDir=str(self.tmp / "run"),
            sysfsRoot=self.sysfs,
            logFile=str(self.tmp / "log" / "rdma-cni.log"),
        )
        self.delegate.write_text(json.dumps(conf, indent=2))
        keys = ("dataDir", "runDir", "sysfsRoot", "logFile", "link")
        self.policy_paths["rdma-ipvlan"] = {k: conf[k] for k in keys}
        self.write_node_policy()

    def admit_pods(self, held: list[list[str]]) -> None:
        """What kubelet's PodResources API answers once it admitted the pods: each pod's virtual
        devices of the shared pool; rdma-multus asks it at ADD, as on a real node (no checkpoint)."""
        self.pod_resources.set_allocatable(RESOURCE, {str(i): None for i in range(SHARED_COUNT)})
        for name, ids in zip(self.pod_names, held, strict=True):
            self.pod_resources.set_pod(POD["namespace"], name, {"main": {RESOURCE: ids}})

    def bond_snapshot(self) -> dict[str, Any]:
        """The node's snapshot as far as the bonds go: their addresses and routes, and the rules (the
        cluster network's veths and /32 routes come and go with the pods, as on any node)."""
        snap = self.host_snapshot()
        return {
            "addr": [a for a in snap["addr"] if a["ifname"] in self.bonds],
            "route": [r for r in snap["route"] if r.get("dev") in self.bonds],
            "rule": snap["rule"],
        }

    def pod_env(self, i: int) -> dict[str, str]:
        env = self.tool_env(self.pod_uids[i])
        name = f"K8S_POD_NAME={POD['name']};"
        env["CNI_ARGS"] = env["CNI_ARGS"].replace(name, f"K8S_POD_NAME={self.pod_names[i]};")
        return env

    def pod_addresses(self, i: int) -> dict[str, str]:
        """Bond interface of pod i -> its IPv4 address."""
        links = json.loads(run("ip", "-n", self.pods[i], "-4", "-j", "addr").stdout or "[]")
        got = {a["ifname"]: a["addr_info"][0]["local"] for a in links if a.get("addr_info")}
        return {b: got[b] for b in self.bonds if b in got}

    def container_id(self, i: int) -> str:
        return container_id_for(f"/run/netns/{self.pods[i]}")

    def gid_table(self) -> list[dict[str, Any]]:
        return collect(self.sysfs, None)

