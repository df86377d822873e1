"""Step 1 of the demo, continued: what the installer puts on the node and how the tools run there.
:class:`Demo` is the node (:class:`.node.Node`) with the plugins installed (the Python entry points, or
the PyInstaller bundle through ``scripts/install.sh``), the CNI configs of ``conf/<mode>`` pointed at the
demo's directories, the cluster network played by a reference plugin, and ``cni-tool`` run in the node
netns; :func:`step_node` shows the node ready for a pod.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rdma_cni.cli.demo.node import ANNOTATION, POD, REFERENCE_PLUGINS, RESOURCE, Node, gid_index
from rdma_cni.cli.demo.shell import REPO, DemoFailed, run, say
from rdma_cni.rdma import sysfs


class Demo(Node):
    """One demo run: the node with rdma-multus, the RDMA plugin and cni-tool installed and configured."""

    def device_plugin_config(self) -> list[str]:
        """The plugin's config flags: rdma-macvlan's delegate config (shared mode gives its own)."""
        return ["--cni-conf", str(self.conf_dir / "rdma-multus.d" / "tke-rdma-macvlan.conf")]


    # ---- the plugins and their configs ----------------------------------------------------------
    def install_plugins(self) -> None:
        self.bin_dir.mkdir()
        if self.bundle:
            run(
                str(REPO / "scripts" / "install.sh"),
                "--bundle",
                self.bundle,
                "--cni-bin-dir",
                str(self.bin_dir),
                "--conf-dir",
                str(self.tmp / "installed.d"),
                "--node-policy",  # this machine's /etc is not the demo node's
                str(self.tmp / "installed-node-policy.json"),
                show=True,
            )
        else:
            for name, module in (
                ("rdma-macvlan", "macvlan"),
                ("rdma-multus", "multus"),
                ("cni-tool", "tool"),
            ):
                path = self.bin_dir / name
                path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rdma_cni.cli.{module} "$@"\n')
                path.chmod(0o755)
        ref = next((d for d in REFERENCE_PLUGINS if os.access(os.path.join(d, "ptp"), os.X_OK)), None)
        if ref is None:
            raise DemoFailed(
                "the reference plugins (ptp, host-local) are missing: run scripts/setup "
                "(Debian package containernetworking-plugins)"
            )
        for name in ("ptp", "bridge", "host-local", "loopback"):  # loopback: what containerd runs for lo
            (self.bin_dir / name).symlink_to(os.path.join(ref, name))

    def write_configs(self) -> None:
        src = REPO / "conf" / self.mode
        delegates = self.conf_dir / "rdma-multus.d"
        delegates.mkdir(parents=True)
        meta = json.loads((src / "00-rdma-multus.conflist").read_text())
        meta["plugins"][0].update(
            confDir=str(delegates),
            kubeconfig="",
            cacheDir=str(self.tmp / "multus-cache"),
            kubeletRootDir=str(self.kubelet_root),
            # kubelet keeps device-plugins/ (and its checkpoint) at a constant path, not under its
            # root dir: name the demo's explicitly.
            devicePluginDir=str(self.kubelet_root / "device-plugins"),
            logFile=str(self.tmp / "log" / "rdma-multus.log"),
        )
        (self.conf_dir / "00-rdma-multus.conflist").write_text(json.dumps(meta, indent=2))
        # Only the paths change: masters come from the RDMA devices (sysfsRoot), as on a real node.
        macvlan = json.loads((src / "rdma-multus.d" / "tke-rdma-macvlan.conf").read_text())
        macvlan.update(
            dataDir=str(self.tmp / "state"),
            runDir=str(self.tmp / "run"),
            sysfsRoot=self.sysfs,
            logFile=str(self.tmp / "log" / "rdma-cni.log"),
        )
        (delegates / "tke-rdma-macvlan.conf").write_text(json.dumps(macvlan, indent=2))
        self.policy_paths = {
            "rdma-macvlan": {**{k: macvlan[k] for k in ("dataDir", "runDir", "sysfsRoot", "logFile")},
                             "kubeletRootDir": str(self.kubelet_root),
                             "devicePluginDir": str(self.kubelet_root / "device-plugins")},
            "rdma-multus": {k: meta["plugins"][0][k] for k in (
                "confDir", "kubeconfig", "cacheDir", "kubeletRootDir", "devicePluginDir", "logFile")},
        }
        self.write_node_policy()
        # The cluster network (tke-route-eni / tke-bridge on TKE) played by a reference plugin.
        plugin: dict[str, Any] = {
            "type": self.default_plugin,
            "ipam": {"type": "host-local", "subnet": "203.0.113.0/24", "dataDir": str(self.tmp / "ipam")},
        }
        if self.default_plugin == "bridge":
            plugin.update(bridge=self.cluster_bridge, isGateway=True)
        cluster = {"cniVersion": "1.0.0", "name": self.default_network, "plugins": [plugin]}
        (delegates / f"{self.default_network}.conflist").write_text(json.dumps(cluster, indent=2))

    @property
    def node_policy(self) -> Path:
        return self.tmp / "node-policy.json"

    def write_node_policy(self) -> None:
        """The node policy an install writes beside the configs (rdma_cni/node_policy.py), with the
        demo node's paths: its configs pass it, and a config naming other paths would not."""
        policy = {"trust": "node", "bondsFrom": "kubelet", "paths": self.policy_paths}
        self.node_policy.write_text(json.dumps(policy, indent=2))

    @property
    def networks(self) -> str:
        """The pod annotation's value in this cluster mode (TKE's guide's two forms)."""
        return f"{self.default_network},tke-rdma-macvlan"

    def write_device_checkpoint(self, pod_uid: str) -> list[str]:
        """What kubelet's device checkpoint records after the device plugin gave the pod its RDMA NICs:
        rdma-multus's fallback when no PodResources API answers (the real-client suites, containerd
        and upstream cnitool, run the demo's node without the demo's kubelet)."""
        devices = [f"mlx5_bond_{i}" for i in self.picked]
        entry = {
            "PodUID": pod_uid,
            "ContainerName": "main",
            "ResourceName": RESOURCE,
            "DeviceIDs": {"0": devices},
            "AllocResp": "",
        }
        path = self.kubelet_root / "device-plugins" / "kubelet_internal_checkpoint"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps({"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {}}, "Checksum": 0})
        )
        return devices

    # ---- running the tools -----------------------------------------------------------------------
    def tool_env(self, pod_uid: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "NETCONFPATH": str(self.conf_dir),
            "CNI_PATH": str(self.bin_dir),
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={POD['namespace']};K8S_POD_NAME={POD['name']};"
            f"K8S_POD_UID={pod_uid};K8S_POD_INFRA_CONTAINER_ID=demo",
            # containerd hands the pod's annotations to a plugin that declares this capability.
            "CAP_ARGS": json.dumps({"io.kubernetes.cri.pod-annotations": {ANNOTATION: self.networks}}),
            "RDMA_CNI_NODE_POLICY": str(self.node_policy),
        }
        if not self.bundle:
            env["PYTHONPATH"] = str(REPO)
        return env

    def cni_tool(
        self, *args: str, env: dict[str, str] | None = None, show: bool = True, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = env or self.tool_env("")
        cmd = [
            "ip",
            "netns",
            "exec",
            self.node,
            str(self.bin_dir / "cni-tool"),
            "--cache-dir",
            str(self.tmp / "cache"),
            *args,
        ]
        if show:
            say(f"$ cni-tool {' '.join(args)}")
        proc = run(*cmd, env=env, check=False)
        if show and proc.stdout.strip():
            say(proc.stdout.rstrip())
        if check and proc.returncode != 0:
            raise DemoFailed(
                f"cni-tool {args[0]} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
            )
        return proc

    def node_options(self) -> list[str]:
        return [
            "--sysfs-root",
            self.sysfs,
            "--netns",
            f"/run/netns/{self.node}",
            "--cni-bin-dir",
            str(self.bin_dir),
            "--conf-dir",
            str(self.conf_dir),
            "--kubelet-root-dir",
            str(self.tmp / "kubelet"),
            "--cache-dir",
            str(self.tmp / "cache"),
        ]


def step_node(d: Demo) -> int:
    """The node with its bonds and RDMA devices; returns the host's GID index."""
    d.wait_for("the simulated RDMA devices", lambda: len(sysfs.list_ports(d.sysfs)) == len(d.bonds))
    d.wait_for("the host GIDs", lambda: all(gid_index(d, i) is not None for i in range(len(d.bonds))))
    run("ip", "-n", d.node, "-br", "addr", show=True)
    d.install_plugins()
    d.write_configs()
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    host_index = gid_index(d, 0)
    if host_index is None:
        raise DemoFailed("bond0's address has no RoCE v2 GID on the simulated node")
    say(f"-> the host's RoCE v2 GID index for bond0's IPv4 address is {host_index} (mlx5: v1 and v2 GIDs)")
    return host_index

