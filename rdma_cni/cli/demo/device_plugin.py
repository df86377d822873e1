"""Step 2 of the demo: the device plugin. kubelet (:mod:`rdma_cni.sim.kubelet`, the device
manager's side of the v1beta1 API on real unix sockets) and the real rdma-device-plugin process in
the node netns; what kubelet sees (capacity, health, NUMA) and what a pod gets when kubelet admits it:
whole bonds in exclusive mode (:func:`exclusive_pool`), every RDMA device through a virtual device of
the shared pool in shared mode (:func:`shared_pool`). Its PodResources API then says which devices
the pod holds, as rdma-multus asks it on a real node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rdma_cni.cli.demo.installed import Demo
from rdma_cni.cli.demo.node import POD, RESOURCE
from rdma_cni.cli.demo.shared_node import GID_ENV, SHARED_COUNT, SharedDemo
from rdma_cni.cli.demo.shell import REPO, DemoFailed, say


@contextmanager
def device_plugin(d: Demo) -> Iterator[Any]:
    """kubelet (rdma_cni.sim.kubelet: the device manager's side of the v1beta1 API on real unix
    sockets) and the real rdma-device-plugin process in the node netns; yields kubelet's endpoint
    once the plugin registered. The plugin is stopped with SIGTERM (it removes its socket)."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # no C-core INFO lines in the demo's output
    # Here, after GRPC_VERBOSITY: grpc reads it when it loads, and the simulated kubelet loads it
    # (45-100 ms, python -X importtime, which the demo's --help and a bad --mode never pay).
    from rdma_cni.sim.kubelet import TestKubelet
    from rdma_cni.sim.podresources import PodResourcesServer

    d.pod_resources = PodResourcesServer(str(d.kubelet_root / "pod-resources" / "kubelet.sock"))
    kubelet = TestKubelet(d.kubelet_root, pod_resources=d.pod_resources.add_to).start()
    if d.bundle:
        cmd = [os.path.join(d.bundle, "rdma-device-plugin")]
    else:
        cmd = [sys.executable, "-m", "rdma_cni.cli.device_plugin"]
    cmd = ["ip", "netns", "exec", d.node, *cmd, "--kubelet-root-dir", str(d.kubelet_root),
           "--sysfs-root", d.sysfs, "--dev-root", d.dev_root,
           *d.device_plugin_config(),
           "--log-file", str(d.tmp / "log" / "rdma-device-plugin.log"),
           "--device-info-dir", str(d.tmp / "devinfo")]
    say(f"$ {' '.join(cmd[4:])}")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        try:
            ep = kubelet.wait_endpoint(RESOURCE, timeout=60)
        except AssertionError as exc:
            raise DemoFailed(f"rdma-device-plugin did not register with kubelet ({exc})") from None
        yield ep
        socket = os.path.join(kubelet.dir, ep.endpoint)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        gone = "removed" if not os.path.exists(socket) else "STILL THERE"
        say(f"rdma-device-plugin stopped (SIGTERM, exit code {proc.returncode}): its socket {gone}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kubelet.stop()


def admit(d: Demo, picks: list[str]) -> None:
    """What kubelet's PodResources API answers once it admitted the pod: the devices Allocate
    was given, per container, with their NUMA nodes; rdma-multus asks it at ADD (no checkpoint)."""
    numa = {f"mlx5_bond_{i}": d.numa(i) for i in range(len(d.bonds))}
    d.pod_resources.set_allocatable(RESOURCE, numa)
    d.pod_resources.set_pod(POD["namespace"], POD["name"], {"main": {RESOURCE: picks}})


def exclusive_pool(d: Demo, ep: Any) -> None:
    """What kubelet sees (capacity, health, NUMA) and what it gets when it admits the pod."""
    def ready(devs: list[Any]) -> bool:
        return len(devs) == len(d.bonds) and all(x.health == "Healthy" for x in devs)

    _, devs = ep.wait_list(ready, 30)
    healthy = sum(1 for x in devs if x.health == "Healthy")
    say(f"kubelet: registered {RESOURCE} from {ep.endpoint} (preferred allocation: "
        f"{ep.options.get_preferred_allocation_available})")
    say(f"-> node capacity {RESOURCE}: {len(devs)}, allocatable: {healthy}")
    for x in devs:
        say(f"   {x.id:<12} {x.health:<9} NUMA node {','.join(map(str, x.numa)) or '-'}")
    ids = [x.id for x in devs]
    picks = ep.preferred(ids, [], d.pod_bonds)
    say(f"kubelet admits a pod asking for {d.pod_bonds}: GetPreferredAllocation -> {', '.join(picks)}")
    resp = ep.allocate(picks).container_responses[0]
    say("Allocate -> the container gets only these device nodes (host numbering kept):")
    for spec in resp.devices:
        say(f"   {spec.container_path:<26} <- {spec.host_path} ({spec.permissions})")
    say("   and these environment variables:")
    for key in sorted(resp.envs):
        say(f"   {key}={resp.envs[key]}")
    d.picked = sorted(int(p.rsplit("_", 1)[1]) for p in picks)
    admit(d, picks)



def shared_pool(d: SharedDemo, ep: Any) -> list[list[str]]:
    """What kubelet sees of the shared pool and what each pod's Allocate gives; the pods' device IDs."""

    def ready(devs: list[Any]) -> bool:
        return len(devs) == SHARED_COUNT and all(x.health == "Healthy" for x in devs)

    try:
        _, devs = ep.wait_list(ready, 30)
    except AssertionError as exc:
        raise DemoFailed(
            f"the shared pool never listed {SHARED_COUNT} healthy devices ({exc})"[:2000]
        ) from None
    healthy = sum(1 for x in devs if x.health == "Healthy")
    numa = sorted({n for x in devs for n in x.numa})
    say(f"kubelet: registered {RESOURCE} from {ep.endpoint} (mode: shared, sharedCount {SHARED_COUNT})")
    say(f"-> node capacity {RESOURCE}: {len(devs)}, allocatable: {healthy}")
    say(
        f'   virtual devices "{devs[0].id}".."{devs[-1].id}", all Healthy (while any RDMA device is usable), '
        f"each on NUMA nodes {','.join(map(str, numa))} (every HCA of the pool)"
    )
    held: list[list[str]] = []
    first: Any = None
    for name in d.pod_names:
        taken = {x for ids in held for x in ids}
        picks = ep.preferred([x.id for x in devs if x.id not in taken], [], 1)
        resp = ep.allocate(picks).container_responses[0]
        say(f"kubelet admits pod {name} asking for 1: GetPreferredAllocation -> {quoted(picks)}; Allocate ->")
        _check_allocation(d, name, resp)
        if first is None:
            for spec in resp.devices:
                say(f"   {spec.container_path:<26} <- {spec.host_path} ({spec.permissions})")
            for key in sorted(resp.envs):
                say(f"   {key}={resp.envs[key]}")
            first = resp
        elif (list(resp.devices), dict(resp.envs)) == (list(first.devices), dict(first.envs)):
            say(
                f"   the same {len(resp.devices)} device nodes and env as {d.pod_names[0]}'s: "
                "every RDMA device"
            )
        else:
            raise DemoFailed(f"{name}'s Allocate differs from {d.pod_names[0]}'s in a shared pool: {resp}")
        held.append(picks)
    say(f"-> no {' / '.join(GID_ENV)}: a shared-mode pod's own GID index exists only after its CNI ADD")
    return held


def quoted(ids: list[str]) -> str:
    """Virtual device IDs quoted: "0" is an ID, not a count."""
    return ", ".join(f'"{i}"' for i in ids)


def _check_allocation(d: SharedDemo, pod: str, resp: Any) -> None:
    """A shared pool mounts every RDMA device (uverbs, umad, issm; rdma_cm once) and names no GID index."""
    paths = {spec.container_path for spec in resp.devices}
    kinds = ("uverbs", "umad", "issm")
    wanted = {f"/dev/infiniband/{kind}{i}" for kind in kinds for i in range(len(d.bonds))} | {
        "/dev/infiniband/rdma_cm"
    }
    hcas = ",".join(f"mlx5_bond_{i}" for i in range(len(d.bonds)))
    if paths != wanted:
        raise DemoFailed(f"{pod}'s Allocate mounts {sorted(paths)}, not every RDMA device {sorted(wanted)}")
    if resp.envs.get("NCCL_IB_HCA") != f"={hcas}" or any(k in resp.envs for k in GID_ENV):
        raise DemoFailed(
            f"{pod}'s Allocate env is {dict(resp.envs)}: want NCCL_IB_HCA=={hcas} and no GID index"
        )
