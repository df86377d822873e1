"""Throw-away network namespaces for tests: a "node", a "switch" and pods, always cleaned up.

A test never touches the machine's own interfaces: the plugin runs inside a node netns (``ip netns
exec``), veth ends stand in for bonds (this kernel has no bonding), and each bond's peer sits in a
switch netns holding a peer address, so pods can ping through their interfaces.

    with node() as n:
        n.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
        pod = n.pod()
        res = n.plugin("ADD", n.config(masters=["bond0"]), pod, container_id="c1")
        assert res.code == 0
        n.pod_exec(pod, "ping", "-c1", "-W2", "198.51.100.1")

Names carry the prefix ``h2-`` plus the pid and a random tag, so parallel test runs do not collide.
Only 198.51.100.0/24 and 203.0.113.0/24 are used.

``node(mode="agent")`` runs the same plugin the way the DaemonSet ships it: an ``rdma-agent`` inside
the node netns, and the static C client as the plugin executable with its in-process fallback
disabled, so every call a test makes is proven to have been answered by an agent worker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

PREFIX = "h2-"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = [sys.executable, "-m", "rdma_cni.cli.macvlan"]


def sh(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def can_run() -> str:
    """Empty when this machine can run netns tests; else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None:
        return "needs iproute2"
    return ""


_PING = r"""
import os, socket, struct, sys, time
dst, iface, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
if iface:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, iface.encode())
ident = os.getpid() & 0xFFFF
def csum(b):
    b += b"\0" * (len(b) % 2)
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    t = (t >> 16) + (t & 0xFFFF); t += t >> 16
    return ~t & 0xFFFF
body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"h2-ping"
pkt = body[:2] + struct.pack("!H", csum(body)) + body[4:]
end = time.time() + timeout
s.settimeout(0.5)
while time.time() < end:
    s.sendto(pkt, (dst, 0))
    try:
        data, addr = s.recvfrom(2048)
    except socket.timeout:
        continue
    hl = (data[0] & 15) * 4
    if addr[0] == dst and data[hl] == 0 and struct.unpack("!H", data[hl + 4:hl + 6])[0] == ident:
        sys.exit(0)
sys.exit(1)
"""


@dataclass
class PluginResult:
    code: int
    out: dict[str, Any]
    stdout: str
    stderr: str


@dataclass
class Pod:
    name: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"


@dataclass
class Node:
    tag: str
    name: str
    switch: str
    tmp: str
    pods: list[Pod] = field(default_factory=list)
    bonds: list[str] = field(default_factory=list)
    mode: str = "in-process"  # or "agent": the C client and an rdma-agent in the node netns

    @property
    def agent_socket(self) -> str:
        return os.path.join(self.tmp, "agent.sock")

    @property
    def data_dir(self) -> str:
        return os.path.join(self.tmp, "state")

    @property
    def run_dir(self) -> str:
        return os.path.join(self.tmp, "run")

    # ------------------------------------------------------------ topology
    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "-n", self.name, *args, check=check)

    def bond(self, name: str, *cidrs: str, peer: str = "", mtu: int = 1500) -> None:
        """A veth ``name`` in the node standing in for a bond, its peer in the switch holding ``peer``."""
        peer_name = f"p{len(self.bonds)}-{self.tag[:6]}"
        sh("ip", "-n", self.name, "link", "add", name, "mtu", str(mtu), "type", "veth", "peer", "name",
           peer_name, "netns", self.switch)
        sh("ip", "-n", self.switch, "link", "set", peer_name, "mtu", str(mtu), "up")
        if peer:
            sh("ip", "-n", self.switch, "addr", "add", peer, "dev", peer_name)
        for cidr in cidrs:
            self.ip("addr", "add", *cidr.split(), "dev", name)
        self.ip("link", "set", name, "up")
        self.bonds.append(name)

    def pod(self) -> Pod:
        pod = Pod(f"{PREFIX}{self.tag}-pod-{uuid.uuid4().hex[:8]}")  # unique even from threads
        sh("ip", "netns", "add", pod.name)
        self.pods.append(pod)
        return pod

    def delete_pod(self, pod: Pod) -> None:
        sh("ip", "netns", "del", pod.name, check=False)

    def pod_exec(self, pod: Pod, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", pod.name, *args, check=check)

    def ping(self, pod: Pod, dst: str, iface: str = "", timeout: float = 3.0) -> bool:
        """One ICMP echo from the pod (optionally out of ``iface``); True when the reply came back.

        Done with a raw socket in Python: this machine has no ping binary.
        """
        proc = sh("ip", "netns", "exec", pod.name, sys.executable, "-c", _PING, dst, iface, str(timeout),
                  check=False)
        return proc.returncode == 0

    def pod_json(self, pod: Pod, *args: str) -> Any:
        return json.loads(sh("ip", "-n", pod.name, "-j", *args).stdout or "[]")

    def node_json(self, *args: str) -> Any:
        return json.loads(self.ip("-j", *args).stdout or "[]")

    def snapshot(self, settle: float = 5.0) -> dict[str, Any]:
        """What must be identical before ADD and after DEL: addresses, routes and rules of the node.

        Waits (up to ``settle`` s) for IPv6 DAD to finish, since a restored IPv6 address is briefly
        'tentative' exactly like a freshly configured one.
        """
        deadline = time.monotonic() + settle
        while True:
            snap = {
                "addr": self.node_json("addr"),
                "route4": self.node_json("-4", "route", "show", "table", "all"),
                "route6": self.node_json("-6", "route", "show", "table", "all"),
                "rule4": self.node_json("-4", "rule"),
                "rule6": self.node_json("-6", "rule"),
                "links": sorted(link["ifname"] for link in self.node_json("link")),
            }
            if self._settled(snap["addr"]) or time.monotonic() > deadline:
                return snap
            time.sleep(0.1)

    def _settled(self, addrs: list[dict[str, Any]]) -> bool:
        """No address is tentative and every bond that is up has its link-local (DAD finished)."""
        if "tentative" in json.dumps(addrs):
            return False
        for link in addrs:
            if link["ifname"] in self.bonds and "UP" in link["flags"]:
                if not any(a["family"] == "inet6" and a["scope"] == "link" for a in link["addr_info"]):
                    return False
        return True

    # ------------------------------------------------------------ plugin
    def config(self, **keys: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "name": "rdma-net",
            "type": "rdma-macvlan",
            "dataDir": self.data_dir,
            "runDir": self.run_dir,
            "logFile": os.path.join(self.tmp, "plugin.log"),
            "logLevel": "debug",
            "rdma": {"required": False},
        }
        conf.update(keys)
        return conf

    def env(self, command: str, pod: Pod | str | None, container_id: str, ifname: str,
            extra: Mapping[str, str] | None = None) -> dict[str, str]:
        netns = pod.path if isinstance(pod, Pod) else (pod or "")
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "PYTHONPATH": REPO,
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_NETNS": netns,
            "CNI_IFNAME": ifname,
            "CNI_PATH": "/usr/lib/cni:/opt/cni/bin",
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p",
            # the node's policy (tests/conftest.py: configs decide, unless a test gives its own)
            "RDMA_CNI_NODE_POLICY": os.environ.get("RDMA_CNI_NODE_POLICY", ""),
        }
        if self.mode == "agent":
            env["RDMA_CNI_AGENT_SOCKET"] = self.agent_socket
            env["RDMA_CNI_FALLBACK"] = self.refused()  # a call the agent did not answer fails the test
            # READY within the client's production bound (3 s, else the plugin runs in-process) is
            # test_agent_timeout's; here every call must reach a worker, also on a CPU other workers
            # keep busy, where an agent forking its refill after a burst took longer than that.
            env["RDMA_CNI_AGENT_TIMEOUT"] = "60"
        env.update(extra or {})
        return env

    def refused(self) -> str:
        """The fallback of agent mode: exit 1 with an error that says the agent did not answer, so a
        test that fails on it names the cause instead of showing an empty answer."""
        path = os.path.join(self.tmp, "agent-did-not-answer")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write("#!/bin/sh\n"
                        "echo '{\"code\": 999, \"msg\": \"the agent did not answer: the fallback ran\"}'\n"
                        "exit 1\n")
            os.chmod(path, 0o755)
        return path

    def argv(self) -> list[str]:
        if self.mode == "agent":
            return ["ip", "netns", "exec", self.name, c_client()]
        return ["ip", "netns", "exec", self.name, *PLUGIN]

    def plugin(self, command: str, conf: Mapping[str, Any], pod: Pod | str | None = None,
               container_id: str = "c1", ifname: str = "net1", extra: Mapping[str, str] | None = None,
               timeout: float = 60) -> PluginResult:
        """Run the real plugin executable inside the node netns, like a runtime would."""
        proc = subprocess.run(
            self.argv(), input=json.dumps(conf).encode(), capture_output=True, timeout=timeout,
            env=self.env(command, pod, container_id, ifname, extra), check=False,
        )
        return _result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())

    def start(self, command: str, conf: Mapping[str, Any], pod: Pod | str | None = None,
              container_id: str = "c1", ifname: str = "net1",
              extra: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start the plugin without waiting (concurrency and kill -9 tests)."""
        proc = subprocess.Popen(
            self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self.env(command, pod, container_id, ifname, extra),
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(conf).encode())
        proc.stdin.close()
        proc.stdin = None  # communicate() must not flush it again
        return proc

    def state_files(self) -> list[str]:
        d = os.path.join(self.data_dir, "attachments")
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def pins(self) -> dict[str, str]:
        """bond -> container ID, read straight from the state files."""
        out = {}
        for name in [f for f in self.state_files() if f.endswith(".json")]:
            with open(os.path.join(self.data_dir, "attachments", name)) as f:
                rec = json.load(f)
            for b in rec["bonds"]:
                out[b["bond"]] = rec["container_id"]
        return out


def finish(proc: subprocess.Popen[bytes], timeout: float = 60) -> PluginResult:
    out, err = proc.communicate(timeout=timeout)
    return _result(proc.returncode, out.decode(), err.decode())


def _result(code: int, stdout: str, stderr: str) -> PluginResult:
    try:
        out = json.loads(stdout) if stdout.strip() else {}
    except ValueError:
        out = {"unparsed": stdout}
    return PluginResult(code, out, stdout, stderr)


_CLIENT_DIR: list[str] = []


def c_client() -> str:
    """``rdma-macvlan`` as shipped: the C client (built once per test run by scripts/build-client)."""
    if not _CLIENT_DIR:
        out = tempfile.mkdtemp(prefix=f"{PREFIX}client-")
        build_c_client(out)
        os.symlink("rdma-cni-client", os.path.join(out, "rdma-macvlan"))
        _CLIENT_DIR.append(out)
    return os.path.join(_CLIENT_DIR[0], "rdma-macvlan")


def build_c_client(out: str) -> None:
    """``scripts/build-client``: the static C client as ``out/rdma-cni-client``."""
    sh(os.path.join(REPO, "scripts", "build-client"), "--out", out, timeout=300)


def launch_agent(sock: str, log: str, *args: str, netns: str = "",
                 env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """An ``rdma-agent`` serving ``sock`` (inside ``netns`` when given), its output appended to
    ``log``; returns once the socket exists, raises (with the log's tail) if it never does."""
    cmd = [sys.executable, "-m", "rdma_cni.cli.agent", "--socket", sock, *args]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=dict(env) if env else None, cwd=REPO)
    deadline = time.monotonic() + 180  # a hung agent's bound: a loaded CPU took over 60 s to start one
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_agent(proc)
            with open(log) as f:
                raise AssertionError(f"rdma-agent did not start: {f.read()[-2000:]}")
        time.sleep(0.02)
    return proc


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid``, read from /proc (no dependency on procps)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def stop_agent(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the agent removes its socket), SIGKILL if it has not left within 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def node(mode: str = "in-process") -> Iterator[Node]:
    """A node netns + switch netns + temp dirs (+ an rdma-agent in ``agent`` mode); everything (pods
    included) removed on exit."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    n = Node(tag=tag, name=f"{PREFIX}{tag}-node", switch=f"{PREFIX}{tag}-sw",
             tmp=tempfile.mkdtemp(prefix=f"{PREFIX}{tag}-"), mode=mode)
    agent: subprocess.Popen[bytes] | None = None
    try:
        sh("ip", "netns", "add", n.name)
        sh("ip", "netns", "add", n.switch)
        sh("ip", "-n", n.name, "link", "set", "lo", "up")
        sh("ip", "-n", n.switch, "link", "set", "lo", "up")
        # No DAD probes: link-locals settle at once, and a restored IPv6 address is usable at once.
        for ns in (n.name, n.switch):
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.dad_transmits=0",
               "net.ipv6.conf.default.dad_transmits=0")
        if mode == "agent":
            log = os.path.join(n.tmp, "agent.log")
            env = dict(os.environ, PYTHONPATH=REPO)
            agent = launch_agent(n.agent_socket, log, "--reconcile-interval", "-1", netns=n.name, env=env)
        yield n
    finally:
        if agent is not None:
            stop_agent(agent)
        for pod in n.pods:
            sh("ip", "netns", "del", pod.name, check=False)
        sh("ip", "netns", "del", n.name, check=False)
        sh("ip", "netns", "del", n.switch, check=False)
        shutil.rmtree(n.tmp, ignore_errors=True)


def policy_env() -> dict[str, str]:
    """The node policy every plugin process of the suite runs under (tests/conftest.py), for a test
    that builds a plugin's environment from nothing."""
    return {"RDMA_CNI_NODE_POLICY": os.environ.get("RDMA_CNI_NODE_POLICY", "")}
