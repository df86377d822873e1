"""``up``, ``down`` and ``status`` of the test cluster; what ``up`` made is recorded in a state file
as it is made, so ``down`` (also after a failure, a SIGTERM, or a run killed with -9 and swept by the
next ``up``) removes exactly that: processes by pid, mounts, namespaces, cgroups, files.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import apiread, build, control_plane, images, procs, registry
from cluster import node as nodemod
from cluster import topology as topo
from cluster.build import Binaries
from cluster.images import Image
from cluster.node import RUN, WORK, Node
from cluster.procs import Proc, StartError
from cluster.registry import RegistryBins
from cluster.versions import CACHE_ROOT, MULTUS, MULTUS_BUILD

log = logging.getLogger("cluster")
STATE = RUN / "state.json"
REPO = Path(__file__).resolve().parents[2]
# the product's image tags: the manifest's, and one more for the rolling-update test
PRODUCT_TAGS = ("0.1.0", "0.1.1")


@dataclass
class State:
    nodes: int = 0
    netns: list[str] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    mntns: list[str] = field(default_factory=list)
    mountpoints: list[str] = field(default_factory=list)  # host dirs up created as mount points
    cgroups: list[str] = field(default_factory=list)
    kept: str = ""  # who keeps it up for the next test module (:func:`shared`), "" for nobody

    def save(self) -> None:
        RUN.mkdir(parents=True, exist_ok=True)
        doc = {
            "nodes": self.nodes,
            "netns": self.netns,
            "procs": procs.dump(self.procs),
            "mntns": self.mntns,
            "mountpoints": self.mountpoints,
            "cgroups": self.cgroups,
            "kept": self.kept,
        }
        procs.json_dump(STATE, doc)

    @classmethod
    def load(cls) -> State:
        try:
            doc: dict[str, Any] = json.loads(STATE.read_text())
        except (OSError, ValueError):
            return cls()
        return cls(
            doc["nodes"],
            doc["netns"],
            procs.load(doc["procs"]),
            doc["mntns"],
            doc["mountpoints"],
            doc["cgroups"],
            doc.get("kept", ""),
        )


def kubectl_argv(bins: Binaries, *args: str) -> list[str]:
    """kubectl as the cluster's admin, from node 1's netns (the API server listens only there)."""
    return [
        "ip",
        "netns",
        "exec",
        topo.node_netns(1),
        bins.path("kubectl"),
        f"--kubeconfig={WORK / 'pki' / 'admin.kubeconfig'}",
        *args,
    ]


def kubectl(
    bins: Binaries, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        kubectl_argv(bins, *args), capture_output=True, text=True, input=stdin, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()[-2000:]}")
    return proc


GPU = "nvidia.com/gpu"
RDMA = "tke.cloud.tencent.com/tke-shared-rdma"


def node_resources(bins: Binaries, node: str, resource: str) -> tuple[int, int]:
    """A node's capacity and allocatable of an extended resource, as the API server has them
    ((-1, -1) while the node is not registered or the API server does not answer). A poll: read
    in process (cluster.apiread), not by kubectl."""
    try:
        status = apiread.node(node)["status"]
    except apiread.ReadError:
        return -1, -1
    return (
        quantity(status.get("capacity", {}).get(resource, "0")),
        quantity(status.get("allocatable", {}).get(resource, "0")),
    )


def _registered(bins: Binaries, node: str) -> bool:
    try:
        apiread.node(node)
    except apiread.ReadError:
        return False
    return True


def _offers(bins: Binaries, node: str, resource: str, count: int) -> bool:
    return node_resources(bins, node, resource)[0] == count


def quantity(text: str) -> int:
    """A count as the API server writes it: 8, or 1k for 1000 (a resource.Quantity in canonical form)."""
    suffixes = {"k": 10**3, "M": 10**6, "G": 10**9}
    if text[-1:] in suffixes:
        return int(text[:-1]) * suffixes[text[-1]]
    return int(text)


LOCK = Path("/run/lock/rdma-cni-cluster.lock")


@contextlib.contextmanager
def exclusive(timeout: float = 3600) -> Iterator[None]:
    """One cluster per machine: its namespaces, mount points and cgroups have fixed names. A second
    test run (another checkout's suite, a worker) waits here for the first to finish, instead of
    sweeping the cluster the first one is using."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another test cluster held {LOCK} for {timeout:.0f} s") from None
                # a short look: a script that starts its next run a second after the last one must
                # not take the lock again and again from a run that was already waiting (seen: 40 min)
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare() -> tuple[Binaries, list[Image], RegistryBins]:
    """Everything ``up`` needs that is built once and cached: the Go builds, the images (the product's
    from this checkout, so a changed checkout builds a new one), the registry."""
    bins = build.build_all()
    multus = (MULTUS_BUILD.bin_dir, MULTUS)
    imgs = images.build_images(REPO, CACHE_ROOT, PRODUCT_TAGS, multus)
    return bins, imgs, registry.build_registry(CACHE_ROOT)


# The modules that leave the cluster as a fresh one but for what `helm uninstall` leaves on a node
# (the bundle, the CNI configs), in this order: test_cluster_e2e, test_cluster_rollout and
# release/test_release_cluster (tests/suite_plan.py FIRST keeps them together).
SHARED_HELM = "helm"


def _keeper(n_nodes: int, key: str) -> str:
    return f"{os.getpid()}:{key}:{n_nodes}"


@contextlib.contextmanager
def shared(n_nodes: int, key: str, clean: Callable[[], bool]) -> Iterator[State]:
    """The cluster of one test module, which the next module of this process with the same ``key``
    and node count takes over instead of a new one (an ``up`` is 20-30 s, a ``down`` ~3 s).

    Only modules that leave the cluster as they found it share a key: their products uninstalled,
    their pods gone. ``clean()`` says, at the end, whether this one did (no test of it failed): if
    not, the cluster goes down. Any ``up`` (another module, another process) sweeps a kept cluster
    first; :func:`down_if_kept` ends the one this process still keeps when its session ends. Call
    it inside :func:`exclusive`."""
    st = State.load()
    if st.kept == _keeper(n_nodes, key) and st.procs and all(procs.alive(p) for p in st.procs):
        log.info("cluster kept by the previous module taken over: %d node(s)", n_nodes)
        st.kept = ""
        st.save()
    else:
        st = up(n_nodes)
    keep = False
    try:
        yield st
        keep = clean()
    finally:
        if keep:
            st = State.load()
            st.kept = _keeper(n_nodes, key)
            st.save()
        else:
            down()


@contextlib.contextmanager
def for_module(n_nodes: int, key: str, clean: Callable[[], bool]) -> Iterator[None]:
    """A test module's cluster (:func:`shared`), inside :func:`exclusive`. While working on tests,
    ``RDMA_CNI_CLUSTER_REUSE=1`` uses a cluster that is up as it is, and keeps one made here up."""
    if os.environ.get("RDMA_CNI_CLUSTER_REUSE") == "1":
        if not State.load().procs:
            up(n_nodes)
        yield
        return
    with shared(n_nodes, key, clean):
        yield


def no_new_failures(session: Any) -> Callable[[], bool]:
    """``clean`` for :func:`shared` from a pytest session: no test failed since this call."""
    failed = session.testsfailed
    return lambda: bool(session.testsfailed == failed)


def down_if_kept() -> None:
    """End the cluster this process kept for a next module that did not come (its session ends)."""
    if State.load().kept.startswith(f"{os.getpid()}:"):
        with exclusive():
            if State.load().kept.startswith(f"{os.getpid()}:"):
                down()


def start_registry(reg: RegistryBins, imgs: Sequence[Image], logs: Path) -> Proc:
    """The cluster's registry on the fabric (203.0.113.1:5000), every image pushed into it: what the
    nodes' containerd pull through their docker.io and registry.k8s.io mirrors."""
    argv = registry.serve_argv(reg, topo.REGISTRY, WORK / "registry")
    (WORK / "registry").mkdir(parents=True, exist_ok=True)
    proc = procs.spawn("registry", argv, logs / "registry.log", topo.FABRIC)
    procs.wait_for("the registry's port", lambda: "serving on port" in procs.tail(proc.log, 50), 30, proc)
    for img in imgs:
        registry.push(reg, img, topo.REGISTRY, netns=topo.FABRIC)
    return proc


def up(n_nodes: int = 1, audit: Sequence[str] = ()) -> State:
    """The whole cluster; on any failure everything made so far is removed and the error re-raised.
    ``audit``: users whose API requests the API server's audit log records (control_plane.audit_policy)."""
    if not 1 <= n_nodes <= topo.MAX_NODES:
        raise ValueError(f"--nodes {n_nodes}: 1 or {topo.MAX_NODES} (two nodes' bonds fill 198.51.100.0/24)")
    down()  # sweeps what a run killed with -9 left
    t0 = time.monotonic()
    bins, imgs, reg = prepare()
    log.info("binaries and images ready in %.1f s", time.monotonic() - t0)
    st = State(nodes=n_nodes)
    t0 = time.monotonic()
    try:
        _up(st, bins, n_nodes, reg, imgs, audit)
    except BaseException:
        log.error("up failed: removing what it made")
        down()
        raise
    log.info("cluster up in %.1f s: %d node(s)", time.monotonic() - t0, n_nodes)
    return st


def _up(
    st: State, bins: Binaries, n_nodes: int, reg: RegistryBins, imgs: Sequence[Image], audit: Sequence[str]
) -> None:
    logs = WORK / "logs"
    pki = WORK / "pki"
    logs.mkdir(parents=True, exist_ok=True)
    st.netns.append(topo.FABRIC)
    st.save()
    topo.make_fabric()
    nodes = [Node(n) for n in range(1, n_nodes + 1)]
    st.mountpoints = nodemod.mountpoints_to_make()
    st.save()
    for p in st.mountpoints:
        os.makedirs(p, exist_ok=True)
    for nd in nodes:
        st.netns.append(nd.netns)
        st.mntns.append(nd.mntns)
        st.save()
        topo.make_node_net(nd.n)
        nodemod.make_mount_ns(nd)
        nodemod.mount_node_view(nd)
        st.cgroups += nodemod.make_cgroups(nd)
        st.save()
        st.procs.append(nodemod.start_sim(nd, logs / nd.name))
        st.save()
        nodemod.mount_sys(nd)
        nodemod.cluster_network_config(nd)
    st.procs.append(start_registry(reg, imgs, logs))
    st.save()
    for nd in nodes:
        st.procs.append(nodemod.start_containerd(nd, bins, topo.REGISTRY, logs / nd.name))
        st.save()
    # Multus's image (~150 MB) only in the registry: pulled by the tests that install Multus, not
    # imported into every node of every cluster
    kept = [i.archive for i in imgs if "debian" not in i.ref and i.repository != images.MULTUS_REPO]
    # the imports (~9 s a node) while the control plane starts (~4 s): neither needs the other
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        imports = [pool.submit(nodemod.import_images, nd, bins, kept) for nd in nodes]
        control_plane.make_pki(pki, n_nodes)
        if audit:
            control_plane.audit_policy(pki, audit)
        st.procs += control_plane.start(bins, pki, WORK / "data", logs, topo.node_netns(1))
        st.save()
        for f in imports:
            f.result()
    for nd in nodes:
        st.procs.append(nodemod.start_kube_proxy(nd, bins, pki, logs / nd.name))
        st.procs.append(nodemod.start_kubelet(nd, bins, pki, logs / nd.name))
        st.save()
    for nd in nodes:
        kubelet = next(p for p in st.procs if p.name == f"{nd.name}/kubelet")
        procs.wait_for(
            f"node {nd.name} registered",
            functools.partial(_registered, bins, nd.name),
            120,
            kubelet,
        )
        st.procs.append(nodemod.start_gpu_plugin(nd, logs / nd.name))
        st.save()
    for nd in nodes:
        gpu = next(p for p in st.procs if p.name == f"{nd.name}/gpu-plugin")
        procs.wait_for(
            f"{nd.name}'s nvidia.com/gpu capacity",
            functools.partial(_offers, bins, nd.name, GPU, 8),
            60,
            gpu,
        )


DOWN_GRACE = 2.0  # s: SIGTERM to SIGKILL in down


def down() -> None:
    """Remove everything the recorded (or a swept) run made. Safe to call twice."""
    st = State.load()
    # Everything's state goes with it (etcd's data, the nodes' dirs): no exit needs to be graceful.
    # On SIGTERM the API server drains its clients' watches and stayed up > 10 s (the default
    # grace, every down), etcd 7 s: what is alive after 2 s is killed.
    procs.stop(st.procs, grace=DOWN_GRACE)
    # processes left in the nodes' cgroups: containers and shims started by the runtime we ran
    for cg in st.cgroups:
        _kill_cgroup_tree(Path(cg))
    _kill_shims()
    for mnt in st.mntns:
        subprocess.run(["umount", "-l", mnt], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            os.unlink(mnt)
    topo.remove_netns(sorted(set(st.netns) | set(topo.leftover_netns())))
    for cg in sorted(st.cgroups, key=len, reverse=True):
        _rmdir_tree(Path(cg))
    for p in st.mountpoints:
        with contextlib.suppress(OSError):
            os.rmdir(p)
    _umount_under(WORK)
    shutil.rmtree(WORK, ignore_errors=True)
    if nodemod.NS_DIR.exists():
        subprocess.run(["umount", "-l", str(nodemod.NS_DIR)], capture_output=True, check=False)
    shutil.rmtree(RUN, ignore_errors=True)


def _kill_cgroup_tree(root: Path) -> None:
    """SIGKILL every task under the node's cgroup root: pods and shims the node's runtime started."""
    if root.exists():
        _kill_until_gone(lambda: {int(x) for f in root.rglob("cgroup.procs") for x in f.read_text().split()})


def _kill_shims() -> None:
    """SIGKILL the runtime's shims. containerd-shim-runc-v2 detaches from containerd (it outlives a
    containerd restart by design) into the root cgroup, so neither the recorded pids nor the nodes'
    cgroups hold it, and one whose containerd was stopped never exits: 14 were found after a day of
    runs, each keeping its node's network and mount namespaces alive. Ours run the shim binary this
    harness built (under CACHE_ROOT); only the cluster's holder of :func:`exclusive` runs them."""
    _kill_until_gone(our_shims)


def _kill_until_gone(find: Callable[[], Iterable[int]]) -> None:
    """SIGKILL what ``find`` names, and again until it names nothing: at most 20 rounds, 0.2 s
    apart."""
    for _ in range(20):
        pids = list(find())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        time.sleep(0.2)


def our_shims() -> list[int]:
    """The pids of the shims this harness's containerd started (see :func:`_kill_shims`)."""
    return [pid for pid in _pids() if _is_our_shim(pid)]


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _is_our_shim(pid: int) -> bool:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return exe.startswith(f"{CACHE_ROOT}/") and os.path.basename(exe).startswith("containerd-shim")


def _rmdir_tree(root: Path) -> None:
    if not root.exists():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def _umount_under(root: Path) -> None:
    """Mounts under the work dir seen from the host (overlay snapshots, pod volumes), deepest first."""
    if not root.exists():
        return
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(root))), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, check=False)


def restart(name: str, sig: int = signal.SIGTERM) -> float:
    """End one recorded component with ``sig`` and start it again as ``up`` did (kubelet, the API
    server, ...): the fault tests. The seconds it took."""
    t0 = time.monotonic()
    stop_one(name, sig)
    start_again(name)
    return time.monotonic() - t0


def stop_one(name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Signal one recorded component and wait until it is gone."""
    st = State.load()
    p = next(p for p in st.procs if p.name == name)
    if procs.alive(p):
        os.kill(p.pid, sig)
    deadline = time.monotonic() + timeout
    while procs.alive(p) and time.monotonic() < deadline:
        time.sleep(0.05)
    if procs.alive(p):
        os.kill(p.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(p.pid, 0)


def start_again(name: str) -> Proc:
    """Start a component that :func:`stop_one` ended, the way ``up`` started it; recorded."""
    bins = build.binaries()
    logs, pki = WORK / "logs", WORK / "pki"
    control = {
        "etcd": lambda: control_plane.start_etcd(bins, pki, WORK / "data", logs, topo.node_netns(1)),
        "kube-apiserver": lambda: control_plane.start_apiserver(bins, pki, logs, topo.node_netns(1)),
        "kube-controller-manager": lambda: control_plane.spawn_controller_manager(
            bins, pki, logs, topo.node_netns(1)
        ),
        "kube-scheduler": lambda: control_plane.spawn_scheduler(bins, pki, logs, topo.node_netns(1)),
    }
    if name in control:
        new = control[name]()
    else:
        node_name, _, comp = name.partition("/")
        nd = Node(int(node_name.rsplit("-", 1)[1]))
        starters = {
            "kubelet": lambda: nodemod.start_kubelet(nd, bins, pki, logs / nd.name),
            "containerd": lambda: nodemod.start_containerd(nd, bins, topo.REGISTRY, logs / nd.name),
        }
        new = starters[comp]()
    st = State.load()
    st.procs = [p for p in st.procs if p.name != name] + [new]
    st.save()
    return new


def restart_if_dead(name: str) -> bool:
    """Start a recorded component again if it exited (kubelet's job for a static pod); whether it did."""
    p = next((p for p in State.load().procs if p.name == name), None)
    if p is None or procs.alive(p):
        return False
    start_again(name)
    return True


def status() -> str:
    st = State.load()
    if not st.procs:
        return "cluster: down"
    lines = [f"cluster: {st.nodes} node(s)"]
    for p in st.procs:
        lines.append(f"  {p.name:40s} pid {p.pid:7d} {'running' if procs.alive(p) else 'DEAD'}  log {p.log}")
    return "\n".join(lines)


__all__ = ["StartError", "State", "down", "kubectl", "kubectl_argv", "status", "up"]
