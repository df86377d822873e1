"""A simulated RDMA node for the device plugin: bonds (veth) in a node netns, the simulated sysfs
(rdma_cni.sim.node, mirroring every address move into GID tables, with NUMA nodes, the mad class and
``mknod`` char devices under a dev root), the tke-rdma-macvlan config, a test kubelet, and the real
``rdma-device-plugin`` process started inside the node netns (so its netlink health watch sees the bonds).

    with dp_node(bonds=8, numa=lambda i: i // 4) as d:
        proc = d.start()                       # returns once kubelet has its registration
        ep = d.endpoint()
        t, devs = ep.wait_list(lambda devs: len(devs) == 8)

Everything made here is removed on exit, also on failure; processes are stopped by their pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from netns import REPO, Node, node
from simnode import sim_node

from rdma_cni.sim.kubelet import Endpoint, TestKubelet

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
PLUGIN = [sys.executable, "-m", "rdma_cni.cli.device_plugin"]


def bond_cidr(i: int) -> str:
    return f"198.51.100.{16 * i + 2}/28"


@dataclass
class DpNode:
    n: Node
    sysfs: str
    dev: str
    conf: str
    run_dir: str
    log: str
    kubelet: TestKubelet
    bonds: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    plugin: list[str] = field(default_factory=lambda: list(PLUGIN))  # or the bundle's rdma-device-plugin

    def argv(self, *extra: str) -> list[str]:
        return ["ip", "netns", "exec", self.n.name, *self.plugin,
                "--kubelet-root-dir", self.kubelet.root, "--sysfs-root", self.sysfs, "--dev-root", self.dev,
                "--cni-conf", self.conf, "--run-dir", self.run_dir, "--log-file", self.log,
                "--device-info-dir", self.device_info_dir,
                "--log-level", "debug", "--rescan-interval", "0.2", *extra]

    @property
    def device_info_dir(self) -> str:
        """Where this node's plugin keeps its NPWG device-info files (never the machine's /var/run)."""
        return os.path.join(self.run_dir, "devinfo")

    def start(self, *extra: str, wait: bool = True,
              previous: Endpoint | None = None) -> subprocess.Popen[bytes]:
        """The plugin as its own process in the node netns; with ``wait``, returns once registered."""
        with open(self.log + ".stderr", "ab") as err:
            proc = subprocess.Popen(self.argv(*extra), stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
                                    env=dict(os.environ, PYTHONPATH=REPO))
        self.procs.append(proc)
        if wait:
            try:
                self.kubelet.wait_endpoint(RESOURCE, newer_than=previous, timeout=30)
            except AssertionError as e:
                raise AssertionError(f"{e}; plugin rc={proc.poll()}, log tail: {self.log_tail()}") from None
        return proc

    def endpoint(self) -> Endpoint:
        return self.kubelet.wait_endpoint(RESOURCE)

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def log_text(self) -> str:
        text = ""
        for path in (self.log, self.log + ".stderr"):
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text += f.read()
        return text

    def log_tail(self, n: int = 3000) -> str:
        return self.log_text()[-n:]

    def status(self) -> dict[str, Any]:
        with open(os.path.join(self.run_dir, "device-plugin", "status.json")) as f:
            doc: dict[str, Any] = json.load(f)
        return doc

    def device(self, i: int) -> str:
        return f"mlx5_bond_{i}"


def wait_for(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> float:
    """Poll ``pred`` until true; the time it took. AssertionError naming ``what`` on timeout."""
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - start


@contextmanager
def dp_node(bonds: int = 2, numa: Callable[[int], int] | None = None,
            kubelet: bool = True, pod_resources: Callable[[Any], None] | None = None) -> Iterator[DpNode]:
    """See the module doc. ``numa(i)``: the NUMA node of bond i (None: no numa_node file at all);
    ``kubelet=False``: the test kubelet is made but not started (the test starts it);
    ``pod_resources``: adds a PodResources servicer to the kubelet's pod-resources/kubelet.sock."""
    with ExitStack() as stack:
        n = stack.enter_context(node())
        names = [f"bond{i}" for i in range(bonds)]
        for i, name in enumerate(names):
            n.bond(name, bond_cidr(i))
        sysfs, dev = os.path.join(n.tmp, "sys"), os.path.join(n.tmp, "dev")
        numa_arg = ["--numa=" + ",".join(str(numa(i)) for i in range(bonds))] if numa is not None else []
        extra = ["--layout", "mlx5", *numa_arg, "--mad", "--rdma-cm", "--dev-root", dev]
        # 8 bonds on a loaded 2-core machine: up to 120 s to start
        stack.enter_context(sim_node(sysfs, names, n.name, f"h2-{n.tag}-pod-", None, extra, timeout=120))
        conf = os.path.join(n.tmp, "tke-rdma-macvlan.conf")
        with open(conf, "w") as f:
            json.dump(n.config(name="tke-rdma-macvlan", masters=names), f)
        k = TestKubelet(os.path.join(n.tmp, "kubelet"), pod_resources=pod_resources)
        d = DpNode(n, sysfs, dev, conf, n.run_dir, os.path.join(n.tmp, "device-plugin.log"), k, names)
        if kubelet:
            k.start()
        try:
            yield d
        finally:
            for proc in d.procs:
                d.stop(proc, signal.SIGKILL, 5)
            k.stop()
