"""End to end, the way kubelet and containerd drive a 4-of-8 RDMA pod: the real rdma-device-plugin
registers with the test kubelet, kubelet asks it for a preferred 4 of 8 and Allocates them, its
PodResources reports that allocation, then the real rdma-multus ADD (runtime-passed annotation) runs
the real rdma-macvlan — and the pod netns holds exactly the bonds whose uverbs nodes the Allocate
response mounted. The plugin keeps those devices healthy while a pod holds their addresses, and the
DEL gives every bond its address back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dpnode import RESOURCE, DpNode, bond_cidr, dp_node, wait_for
from netns import REPO, can_run, policy_env

from rdma_cni.sim.kubelet import TestKubelet
from tests.podresources_server import PodResourcesServer

pytestmark = pytest.mark.netns

REF = Path("/usr/lib/cni")
ANNOTATION = "tke.cloud.tencent.com/networks"


@pytest.fixture(autouse=True)
def _root() -> None:
    reason = can_run() or ("" if (REF / "ptp").exists() else "needs Debian's containernetworking-plugins")
    if reason:
        pytest.skip(reason)


def cni_files(d: DpNode) -> tuple[Path, dict[str, Any]]:
    """rdma-multus's conf dir (ptp as tke-route-eni, rdma-macvlan on the plugin's bonds and state)."""
    root = Path(d.n.tmp) / "cni"
    for sub in ("net.d", "bin", "cache"):
        (root / sub).mkdir(parents=True)
    for plugin in ("ptp", "host-local", "loopback"):
        (root / "bin" / plugin).symlink_to(REF / plugin)
    (root / "bin" / "rdma-macvlan").write_text(f"#!/bin/sh\nexec {sys.executable} -m rdma_cni.cli.macvlan\n")
    (root / "bin" / "rdma-macvlan").chmod(0o755)
    with open(d.conf) as f:
        macvlan = json.load(f)  # the config the device plugin reads its masters and dataDir from
    macvlan.update(resourceName=RESOURCE, sysfsRoot=d.sysfs, rdma={"required": True, "gidTimeoutMs": 5000})
    nets = {
        "tke-route-eni": {
            "type": "ptp",
            "ipMasq": False,
            "ipam": {
                "type": "host-local",
                "dataDir": str(root / "ipam"),
                "ranges": [[{"subnet": "203.0.113.0/26"}]],
            },
        },
        "tke-rdma-macvlan": {k: v for k, v in macvlan.items() if k not in ("cniVersion", "name")},
    }
    for name, plugin in nets.items():
        (root / "net.d" / f"{name}.conflist").write_text(
            json.dumps({"cniVersion": "1.0.0", "name": name, "plugins": [plugin]})
        )
    conf = {
        "cniVersion": "1.0.0",
        "name": "tke-multus",
        "type": "rdma-multus",
        "confDir": str(root / "net.d"),
        "defaultDelegates": "tke-route-eni",
        "binDirs": [str(root / "bin")],
        "cacheDir": str(root / "cache"),
        "kubeletRootDir": d.kubelet.root,
        "logFile": str(root / "multus.log"),
        "runtimeConfig": {
            "io.kubernetes.cri.pod-annotations": {ANNOTATION: "tke-route-eni,tke-rdma-macvlan"}
        },
    }
    return root, conf


def multus(d: DpNode, root: Path, command: str, conf: dict[str, Any], netns: str) -> tuple[int, Any]:
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": REPO,
        "CNI_COMMAND": command, **policy_env(),
        "CNI_CONTAINERID": "sandbox-1",
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(root / "bin"),
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=ibv-app-0;K8S_POD_UID=u-1",
    }
    proc = subprocess.run(
        ["ip", "netns", "exec", d.n.name, sys.executable, "-m", "rdma_cni.cli.multus"],
        input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr


def ipv4(d: DpNode, netns: str | None) -> dict[str, str]:
    """bond-named links -> IPv4 CIDR ("" when none), in the pod netns or (None) the node's."""
    args = ["ip", "-n", netns or d.n.name, "-j", "addr"]
    out = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout or "[]")
    found = {}
    for link in out:
        if link["ifname"] in d.bonds:
            v4 = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
            found[link["ifname"]] = v4[0] if v4 else ""
    return found


def cni_tool(d: DpNode, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    opts = ["--netns", f"/run/netns/{d.n.name}", "--sysfs-root", d.sysfs, "--conf-dir", str(root / "net.d"),
            "--kubelet-root-dir", d.kubelet.root, "--data-dir", d.n.data_dir, "--run-dir", d.run_dir,
            "--cache-dir", str(root / "cache")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": REPO}
    argv = [sys.executable, "-m", "rdma_cni.cli.tool", *args, *opts]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)


def uverbs_of(d: DpNode, device: str) -> str:
    base = os.path.join(d.sysfs, "class", "infiniband_verbs")
    for name in sorted(os.listdir(base)):
        with open(os.path.join(base, name, "ibdev")) as f:
            if f.read().strip() == device:
                return name
    raise AssertionError(f"no uverbs node for {device}")


def test_kubelet_allocates_4_of_8_and_the_pod_gets_exactly_those_bonds_and_devices() -> None:
    pod_resources = PodResourcesServer(socket="")  # served by the test kubelet on its own server
    with dp_node(bonds=8, numa=lambda i: i // 4, kubelet=False) as d:
        d.kubelet = TestKubelet(d.kubelet.root, pod_resources=pod_resources.add_to)
        d.kubelet.start()
        try:
            d.start()
            ep = d.endpoint()
            _, devs = ep.wait_list(
                lambda ds: len(ds) == 8 and all(x.health == "Healthy" for x in ds), timeout=30
            )
            # kubelet's GetAllocatableResources: the healthy devices the plugin listed, with their NUMA node
            pod_resources.set_allocatable(RESOURCE, {x.id: x.numa[0] if x.numa else None for x in devs})

            # Admission: a choice of 4 of 8 that must include mlx5_bond_6 (say, the GPU's NUMA node).
            picks = ep.preferred([f"mlx5_bond_{i}" for i in range(8)], ["mlx5_bond_6"], 4)
            assert sorted(picks) == [f"mlx5_bond_{i}" for i in (4, 5, 6, 7)], picks
            (alloc,) = ep.allocate(picks).container_responses
            pod_resources.set_pod("default", "ibv-app-0", {"trainer": {RESOURCE: picks}})

            root, conf = cni_files(d)
            pod = d.n.pod()
            code, result = multus(d, root, "ADD", conf, pod.path)
            assert code == 0, result
            assert pod_resources.calls == ["Get"]

            mine = [f"bond{i}" for i in (4, 5, 6, 7)]
            assert ipv4(d, pod.name) == {b: bond_cidr(int(b[4:])) for b in mine}
            assert ipv4(d, None) == {b: ("" if b in mine else bond_cidr(int(b[4:]))) for b in d.bonds}
            mounted = {s.container_path for s in alloc.devices if "uverbs" in s.container_path}
            assert mounted == {f"/dev/infiniband/{uverbs_of(d, f'mlx5_bond_{i}')}" for i in (4, 5, 6, 7)}
            assert alloc.envs["NCCL_IB_HCA"] == "=" + ",".join(sorted(picks))
            # The lent bonds have no IPv4 on the node but a pod holds them: still healthy to kubelet.
            wait_for(lambda: all(x["healthy"] for x in d.status()["devices"]), 5, "every device healthy")

            # cni-tool sees the same: kubelet's pod next to the pod holding each bond's IP, no FAIL.
            inv = json.loads(cni_tool(d, root, "state", "--json").stdout)
            got = {
                b["bond"]: (b["allocatedTo"], b["ipHeldBy"], b["allocation"]["status"]) for b in inv["bonds"]
            }
            assert got == {
                b: (("default/ibv-app-0",) * 2 if b in mine else ("", "")) + ("OK",) for b in d.bonds
            }
            report = json.loads(cni_tool(d, root, "doctor", "--json").stdout)
            lines = {
                f["check"]: f for f in report["findings"] if f["check"].startswith(("device-plugin", "alloc"))
            }
            assert lines["device-plugin kubelet"]["status"] == "OK", lines
            assert lines["device-plugin mlx5_bond_6"]["detail"] == "bond6, NUMA 1, healthy"
            assert all(lines[f"allocation {b}"]["status"] == "OK" for b in d.bonds)

            code, out = multus(d, root, "DEL", conf, pod.path)
            assert code == 0, out
            assert ipv4(d, None) == {b: bond_cidr(int(b[4:])) for b in d.bonds}
        finally:
            d.kubelet.stop()
