"""What a user does on the cluster, as functions the tests, ``scripts/demo --cluster`` and the
benchmark share: label the nodes, apply the product's manifest, apply the seed's workloads, wait for
them, look inside a pod, and read a node's network state to prove it exact after the pods left.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from cluster import apiread, chart
from cluster import topology as topo
from cluster.build import Binaries
from cluster.cluster import RDMA, kubectl, kubectl_argv, node_resources, restart, restart_if_dead, status
from cluster.node import Node
from rdma_cni.kube import podresources

log = logging.getLogger("cluster")

REPO = Path(__file__).resolve().parents[2]
SEED_STATEFULSET = Path(__file__).resolve().parent / "seed000-rdma-test.yaml"
TEST_IMAGE = "rdma-cni-test:0.1"
LABEL = "feature.node.kubernetes.io/tke-shared-rdma"


def wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Poll until ``check()`` is truthy; its value. Says what it waited for and what it saw last."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"not within {timeout:.0f} s: {what} (last seen: {last!r})")


def label_nodes(bins: Binaries, nodes: int) -> None:
    for n in range(1, nodes + 1):
        kubectl(bins, "label", "node", topo.node_name(n), f"{LABEL}=true", "--overwrite")


def product_manifest(
    rdma_mode: str = "exclusive", tag: str = "0.1.0", front_end: str = "devicePlugin"
) -> str:
    """What ``kubectl apply`` users apply, with the image tag, the RDMA mode and the front end chosen:
    the chart rendered with those values (conf/k8s/rdma-cni.yaml is its rendering from the defaults,
    conf/k8s/dra/ with ``frontEnd=dra``), without Helm's hooks, which kubectl would run at once (the
    DRA variant's pre-delete check). Shared mode's link is macvlan: this kernel has no IPVLAN, and the
    DaemonSet's refresh loop re-installs the chart's link every 10 minutes, so a node's file edited
    instead (:func:`use_macvlan_link`) would not last."""
    sets = ["--set", f"rdmaMode={rdma_mode}", "--set", f"image.tag={tag}", "--set", f"frontEnd={front_end}"]
    if rdma_mode == "shared":
        sets += ["--set", "shared.link=macvlan"]
    return chart.template(*sets, hooks=False)


def apply(bins: Binaries, text: str) -> None:
    kubectl(bins, "apply", "-f", "-", stdin=text)


def pods(bins: Binaries, selector: str, namespace: str = "default") -> list[dict[str, Any]]:
    """The items of ``kubectl get pods -n NAMESPACE -l SELECTOR -o json``; read in process (every wait
    for pods polls this: cluster.apiread says why). Raises RuntimeError when the API does not answer."""
    return apiread.pods(selector, namespace)


def ready(pod: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return pod.get("status", {}).get("phase") == "Running" and conds.get("Ready") == "True"


def wait_ready(
    bins: Binaries, selector: str, count: int, namespace: str = "default", timeout: float = 180
) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        keep_scheduler()
        ps = [p for p in pods(bins, selector, namespace) if not p["metadata"].get("deletionTimestamp")]
        return ps if len(ps) == count and all(ready(p) for p in ps) else None

    try:
        result: list[dict[str, Any]] = wait(f"{count} ready pods {selector} in {namespace}", check, timeout)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{report(bins, namespace)}") from None
    return result


def unschedulable(bins: Binaries, pod: str, namespace: str = "default") -> str:
    """The scheduler's message when the pod is unschedulable, else '' (also while the API does not
    answer): a poll, read in process."""
    try:
        doc = apiread.pod(pod, namespace)
    except apiread.ReadError:
        doc = {}
    conds = doc.get("status", {}).get("conditions", [])
    return next(
        (c.get("message", "") for c in conds if c["type"] == "PodScheduled" and c["status"] == "False"), ""
    )


def keep_scheduler() -> None:
    """kube-scheduler exits by design when it finds its cache corrupted (seen after the API server
    came back): start it again, as kubelet restarts it as a static pod on a real node. Every wait for
    pods calls this: none of them can end without a scheduler."""
    if restart_if_dead("kube-scheduler"):
        log.warning("kube-scheduler had exited: started again")


def rollout(bins: Binaries, timeout: float = 400) -> None:
    """``kubectl rollout status`` of the product's DaemonSet, keeping the scheduler up while it
    waits; on failure, what the cluster looks like."""
    argv = ("-n", "kube-system", "rollout", "status", "daemonset/rdma-cni", f"--timeout={timeout:.0f}s")
    proc = subprocess.Popen(
        kubectl_argv(bins, *argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + timeout + 20
    while True:
        try:
            _, err = proc.communicate(timeout=1)
            break
        except subprocess.TimeoutExpired:
            keep_scheduler()
            if time.monotonic() > deadline:
                proc.kill()
                _, err = proc.communicate()
                break
    if proc.returncode != 0:
        said = err.strip()[-2000:]
        raise RuntimeError(f"kubectl {' '.join(argv)}: {said}\n{report(bins, 'kube-system')}")


def report(bins: Binaries, namespace: str = "default") -> str:
    """What a timed-out wait saw: the pods and nodes as kubectl shows them and any component of the
    cluster that is no longer running (a flake must say where to look)."""
    parts = []
    for args in (("get", "pods", "-n", namespace, "-o", "wide"), ("get", "nodes", "-o", "wide")):
        out = kubectl(bins, *args, check=False, timeout=30)
        parts.append(f"$ kubectl {' '.join(args)}\n{out.stdout}{out.stderr}")
    dead = [line.strip() for line in status().splitlines() if "DEAD" in line]
    parts.append("dead components: " + ("; ".join(dead) or "none"))
    return "\n".join(parts)


def wait_gone(bins: Binaries, selector: str, namespace: str = "default", timeout: float = 180) -> None:
    wait(f"no pods {selector} left", lambda: not pods(bins, selector, namespace), timeout)


def scale_to_zero(bins: Binaries, workload: str, selector: str, namespace: str = "default") -> None:
    """Scale ``workload`` (``statefulset/ibv-app``) to 0 and wait until its pods are gone. The seed's
    container is ``sh -c ... sleep`` (PID 1 ignores SIGTERM) with the default 30 s grace period, and a
    StatefulSet removes its pods one at a time: its pods' grace is cut to 1 s (the API lets a
    deletion shorten it), which changes when the container is killed, not how the CNI DEL runs."""
    kubectl(bins, "scale", workload, "-n", namespace, "--replicas=0")
    kubectl(
        bins,
        "delete",
        "pods",
        "-n",
        namespace,
        "-l",
        selector,
        "--grace-period=1",
        "--wait=false",
        check=False,
    )
    wait_gone(bins, selector, namespace)


def seed_statefulset(image: str = TEST_IMAGE, replicas: int | None = None) -> str:
    """The seed's StatefulSet, only its image replaced (and the replica count when asked)."""
    doc = yaml.safe_load(SEED_STATEFULSET.read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["image"] = image
    if replicas is not None:
        doc["spec"]["replicas"] = replicas
    return yaml.safe_dump(doc)


def node_capacity(bins: Binaries, node: str) -> tuple[int, int]:
    """The node's capacity and allocatable of the RDMA resource, as the API server has them."""
    return node_resources(bins, node, RDMA)


KUBELET_NOT_YET = "unable to upgrade connection: pod does not exist"


def pod_exec(bins: Binaries, pod: str, *cmd: str, namespace: str = "default", timeout: float = 30) -> str:
    """``kubectl exec``; asked again while the node's kubelet does not know the pod yet: a kubelet
    that just restarted serves exec before it has read its pods from the API server (seen right
    after the kubelet-restart test, while the API server still showed the pods Ready)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return kubectl(bins, "exec", "-n", namespace, pod, "--", *cmd).stdout
        except RuntimeError as e:
            if KUBELET_NOT_YET not in str(e) or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def node_network(node: Node) -> dict[str, Any]:
    """What DEL must give back exactly: the bonds' addresses, every routing table, the rules, and the
    RoCE GID tables of the simulated devices (the pods' own links and the cluster network's veths
    left out: they come and go with pods)."""

    def j(*args: str) -> Any:
        return json.loads(topo.ip("-j", *args, netns=node.netns).stdout or "[]")

    addrs = {
        a["ifname"]: sorted((i["local"], i["prefixlen"]) for i in a.get("addr_info", []))
        for a in j("addr")
        if a["ifname"].startswith("bond")
    }
    routes = sorted(
        json.dumps(r, sort_keys=True)
        for r in j("route", "show", "table", "all")
        if str(r.get("dev", "")).startswith("bond")
    )
    rules = sorted(json.dumps(r, sort_keys=True) for r in j("rule"))
    gids = {}
    for dev in sorted((node.sys_tree / "class" / "infiniband").iterdir()):
        gdir = dev / "ports" / "1" / "gids"
        texts = {g.name: g.read_text().strip() for g in gdir.iterdir()}
        gids[dev.name] = {k: v for k, v in texts.items() if v != "0000:0000:0000:0000:0000:0000:0000:0000"}
    return {"addr": addrs, "route": routes, "rule": rules, "gid": gids}


def network_diff(before: dict[str, Any], now: dict[str, Any]) -> str:
    """Only what changed, per kind: ``-`` missing now, ``+`` new now (the whole tables hide it)."""
    out = []
    for kind in before:
        b, n = before[kind], now.get(kind)
        if b == n:
            continue
        if isinstance(b, list) and isinstance(n, list):
            out += [f"{kind} - {x}" for x in b if x not in n] + [f"{kind} + {x}" for x in n if x not in b]
        else:
            n = n or {}
            keys = sorted(set(b) | set(n))
            out += [f"{kind} {k}: {b.get(k)} -> {n.get(k)}" for k in keys if b.get(k) != n.get(k)]
    return "; ".join(out) or "nothing"


def wait_exact(nodes: list[Node], before: dict[str, dict[str, Any]], timeout: float = 60) -> None:
    """Each node's addresses, routes, rules and GIDs as ``before[node.name]`` (DELs finish after the
    pods go); on timeout, what differs on each node."""
    try:
        wait(
            "every node exactly as before the pods",
            lambda: all(node_network(nd) == before[nd.name] for nd in nodes),
            timeout,
        )
    except TimeoutError as e:
        diffs = {nd.name: network_diff(before[nd.name], node_network(nd)) for nd in nodes}
        raise AssertionError(f"{e}: {diffs}") from None


@contextmanager
def bond_down(node: Node, bond: str) -> Iterator[None]:
    """The bond's link down for the block, then up with the routes it had. Setting a link down makes
    the kernel drop every route through it, the policy tables' gateway routes included, and up brings
    back only the prefix routes of its addresses: on a real node the network scripts add the rest
    again; here the test that flapped the link does, so the node is exact for the tests after it."""
    routes = [
        r
        for r in json.loads(topo.ip("-j", "route", "show", "table", "all", netns=node.netns).stdout or "[]")
        if r.get("dev") == bond and r.get("gateway")
    ]
    topo.ip("link", "set", bond, "down", netns=node.netns)
    try:
        yield
    finally:
        topo.ip("link", "set", bond, "up", netns=node.netns)
        for r in routes:
            table = ("table", str(r["table"])) if r.get("table") else ()
            topo.ip("route", "replace", r["dst"], "via", r["gateway"], "dev", bond, *table, netns=node.netns)


def use_macvlan_link(node: Node) -> None:
    """Shared mode's delegate with ``link: macvlan``: this kernel has no IPVLAN (the VM tests keep
    the IPVLAN default). Written into the node's config and node policy the install container laid
    down, as the chart's ``shared.link=macvlan`` would have written them."""
    path = node.dir("/etc/cni/net.d") / "rdma-multus.d" / "tke-rdma-ipvlan.conf"
    wait(f"{path} installed", path.exists, 120)
    conf = json.loads(path.read_text())
    conf["link"] = "macvlan"
    conf.pop("ipvlanMode", None)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(conf, indent=2))
    tmp.rename(path)
    # and the node policy the same install wrote, which decides the link (a config alone may not)
    policy_path = node.dir("/etc/rdma-cni") / "node-policy.json"
    policy = json.loads(policy_path.read_text())
    policy["paths"]["rdma-ipvlan"]["link"] = "macvlan"
    tmp = policy_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(policy, indent=2))
    tmp.rename(policy_path)


def bare_pod(deployment: dict[str, Any], name: str) -> str:
    """The Deployment's pod as a bare Pod named ``name``: a benchmark creates and deletes one pod at a
    time and counts what each costs, which a ReplicaSet replacing it would blur."""
    tmpl = deployment["spec"]["template"]
    meta = {**tmpl["metadata"], "name": name, "namespace": deployment["metadata"].get("namespace", "default")}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": tmpl["spec"]})


def shared_pod(name: str) -> str:
    """One pod of :func:`shared_deployment`, bare (:func:`bare_pod`)."""
    return bare_pod(yaml.safe_load(shared_deployment(1)), name)


def shared_deployment(replicas: int = 4) -> str:
    """Shared mode's workload: pods annotated ``tke-route-eni,tke-rdma-ipvlan``, each asking for 1."""
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "rdma-shared", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "rdma-shared"}},
            "template": {
                "metadata": {
                    "labels": {"app": "rdma-shared"},
                    "annotations": {"tke.cloud.tencent.com/networks": "tke-route-eni,tke-rdma-ipvlan"},
                },
                "spec": {
                    "nodeSelector": {LABEL: "true"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "app",
                            "image": TEST_IMAGE,
                            "command": ["sleep", "1000000"],
                            "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                            "resources": {"limits": {RDMA: "1"}},
                        }
                    ],
                },
            },
        },
    }
    return yaml.safe_dump(doc)


def kubelet_allocatable(node: Node, resource: str = RDMA) -> int:
    """How many devices of ``resource`` the node's kubelet can hand out now (PodResources
    GetAllocatableResources): kubelet's own view, before its next node status reaches the API."""
    sock = node.dir("/var/lib/kubelet") / "pod-resources" / "kubelet.sock"
    try:
        return sum(1 for a in podresources.allocatable(str(sock), timeout=2) if a.resource == resource)
    except Exception:  # noqa: BLE001 (a kubelet that is restarting answers nothing)
        return -1


def restart_kubelet(node: Node, sig: int, timeout: float = 30) -> float:
    """Restart the node's kubelet with ``sig``; the seconds from the new kubelet's socket to its
    offering 8 bonds again (the product's device plugin re-registered: kubelet's PodResources view)."""
    sock = node.dir("/var/lib/kubelet") / "device-plugins" / "kubelet.sock"

    def identity() -> tuple[int, int] | None:
        try:
            st = sock.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_ctime_ns  # ext4 may give the new socket the old inode number

    old = identity()
    restart(f"{node.name}/kubelet", sig)
    wait("kubelet.sock re-created", lambda: identity() not in (None, old), 60, 0.02)
    since = time.monotonic()
    wait(
        f"{node.name}'s kubelet offers 8 {RDMA} again", lambda: kubelet_allocatable(node) == 8, timeout, 0.05
    )
    return time.monotonic() - since
