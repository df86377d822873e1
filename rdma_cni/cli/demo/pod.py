"""Step 3 of the demo: the pod, annotated as TKE's guide annotates it, ADDed the way containerd does it:
``cni-tool add rdma-multus`` (rdma-multus asks kubelet's PodResources API which devices the pod
holds, then runs the cluster network and the RDMA network). One pod in exclusive mode (:func:`add`),
two in shared mode (:func:`add_pods`).
"""

from __future__ import annotations

import json
import uuid

from rdma_cni.cli.demo.device_plugin import quoted
from rdma_cni.cli.demo.installed import Demo
from rdma_cni.cli.demo.node import ANNOTATION, POD, RESOURCE
from rdma_cni.cli.demo.shared_node import SharedDemo
from rdma_cni.cli.demo.shell import DemoFailed, banner, say
from rdma_cni.sim.sync import wait_watched


def add(d: Demo) -> dict[str, str]:
    banner(f"3. Pod {POD['namespace']}/{POD['name']}: {ANNOTATION}: {d.networks}; {RESOURCE}: {d.pod_bonds}")
    pod_uid = str(uuid.uuid4())
    devices = [f"mlx5_bond_{i}" for i in d.picked]
    say(f"kubelet PodResources: the pod holds {', '.join(devices)} (what Allocate was given above)")
    d.netns(d.pod)
    env = d.tool_env(pod_uid)
    asked = len(d.pod_resources.calls)
    d.cni_tool("add", "rdma-multus", f"/run/netns/{d.pod}", env=env)
    calls = d.pod_resources.calls[asked:]
    if not calls:
        raise DemoFailed("rdma-multus did not ask kubelet's PodResources API which devices the pod holds")
    say(f"-> kubelet's PodResources API was asked ({', '.join(dict.fromkeys(calls))}) which devices the "
        "pod holds: rdma-multus for the device IDs it hands over, rdma-macvlan to check them against the "
        "pod's allocation (the node policy's bondsFrom: kubelet)")
    return env



def add_pods(d: SharedDemo, held: list[list[str]]) -> None:
    banner(f"3. Two pods, each {ANNOTATION}: {d.networks}; {RESOURCE}: 1")
    d.admit_pods(held)
    asked = len(d.pod_resources.calls)
    say(
        "kubelet PodResources: "
        + ", ".join(f"{name} holds device {quoted(ids)}" for name, ids in zip(d.pod_names, held, strict=True))
    )
    for i, pod in enumerate(d.pods):
        d.netns(pod)
        try:  # the simulated RDMA node must follow the pod netns before its addresses appear
            wait_watched(f"/run/netns/{d.node}", f"/run/netns/{pod}")
        except TimeoutError as exc:
            raise DemoFailed(str(exc)) from None
        say(f"$ cni-tool add rdma-multus /run/netns/{pod}    (pod {d.pod_names[i]}; its result, in short:)")
        proc = d.cni_tool("add", "rdma-multus", f"/run/netns/{pod}", env=d.pod_env(i), show=False)
        result = json.loads(proc.stdout)
        names = [x["name"] for x in result["interfaces"]]
        say("-> " + ", ".join(f"{names[ip['interface']]} {ip['address']}" for ip in result["ips"]))
    calls = d.pod_resources.calls[asked:]
    if not calls:
        raise DemoFailed("rdma-multus did not ask kubelet's PodResources API which devices the pods hold")
    say(f"-> rdma-multus asked kubelet's PodResources API ({', '.join(dict.fromkeys(calls))}) "
        "which devices each pod holds")
