"""Real CNI clients around the real ``rdma-macvlan``: upstream cnitool, the project's cni-tool, and
containerd's CRI plugin, all on a node netns from :mod:`netns` (veth ends standing in for bonds).

What each client needs and why it is set up this way:

- The plugin is reached through ``CNI_PATH`` like any runtime would find it: a temp ``bin`` dir
  holding an ``rdma-macvlan`` wrapper script (the Python entry point, warm agent off so a node agent
  started by another test can never answer for us) plus links to Debian's ``tuning`` and
  ``loopback`` (containerd always runs loopback). The same dir is containerd's ``bin_dir``.
- Networks live in a temp ``NETCONFPATH``; cnitool's fixed cache dir ``/var/lib/cni`` is replaced
  by the test's own dir with a bind mount inside a private mount namespace (H1's recipe), and
  cni-tool is pointed at the same dir with ``--cache-dir``, so each tool can CHECK/DEL what the
  other ADDed.
- Both tools run inside the node netns (``ip netns exec``), so the plugin only ever sees the
  node's links; containerd runs there too (H5's harness, with this module's root dir).

Names carry ``h8-`` plus the pid and a random tag; only 198.51.100.0/24 and 203.0.113.0/24 are used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netns import Node, Pod, sh

PREFIX = "h8-"
REPO = Path(__file__).resolve().parent.parent
REF = Path("/usr/lib/cni")
CNI_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=h8;K8S_POD_NAME=h8-pod"


def build_cnitool() -> tuple[str, str]:
    """(path of upstream cnitool, "") or ("", why it cannot be built here)."""
    try:
        proc = subprocess.run([str(REPO / "scripts" / "build-cnitool")], capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"scripts/build-cnitool did not run: {exc}"
    if proc.returncode != 0:
        return "", f"upstream cnitool cannot be built here: {proc.stderr.strip()[-400:]}"
    return proc.stdout.strip().splitlines()[-1], ""


class ClientNode(Node):
    """A :class:`netns.Node` whose pods carry this module's prefix, plus the clients' dirs."""

    def pod(self) -> Pod:
        pod = Pod(f"{PREFIX}{self.tag}-pod-{uuid.uuid4().hex[:8]}")
        sh("ip", "netns", "add", pod.name)
        self.pods.append(pod)
        return pod

    @property
    def bin_dir(self) -> Path:
        return Path(self.tmp) / "bin"

    @property
    def netconf(self) -> Path:
        return Path(self.tmp) / "net.d"

    @property
    def cache(self) -> Path:
        return Path(self.tmp) / "libcni"

    @property
    def calls_log(self) -> Path:
        return Path(self.tmp) / "calls.log"

    def calls(self) -> list[tuple[str, str, bool]]:
        """(CNI_COMMAND, CNI_NETNS, stdin had a prevResult) of every rdma-macvlan exec, in order."""
        if not self.calls_log.exists():
            return []
        rows = [line.split("\t") for line in self.calls_log.read_text().splitlines()]
        return [(cmd, netns, prev != "0") for cmd, netns, prev in rows]

    def install_plugins(self) -> None:
        """The CNI_PATH dir: our plugin as a runtime execs it, and Debian's reference plugins."""
        for d in (self.bin_dir, self.netconf, self.cache):
            d.mkdir(exist_ok=True)
        wrapper = self.bin_dir / "rdma-macvlan"
        wrapper.write_text(
            "#!/bin/sh\n"
            "input=$(cat)\n"
            "prev=$(printf '%s' \"$input\" | grep -c '\"prevResult\"')\n"
            f'printf \'%s\\t%s\\t%s\\n\' "$CNI_COMMAND" "$CNI_NETNS" "$prev" >> {self.calls_log}\n'
            f"export RDMA_CNI_AGENT=off PYTHONPATH={REPO}\n"
            f"printf '%s' \"$input\" | exec {sys.executable} -m rdma_cni.cli.macvlan\n"
        )
        wrapper.chmod(0o755)
        for plugin in ("tuning", "loopback"):
            if (REF / plugin).exists():
                (self.bin_dir / plugin).symlink_to(REF / plugin)

    def conflist(self, network: str, plugins: list[dict[str, Any]], version: str = "1.0.0") -> Path:
        """Write ``network`` (one conflist) into NETCONFPATH, replacing any earlier one."""
        path = self.netconf / f"10-{network}.conflist"
        path.write_text(json.dumps({"cniVersion": version, "name": network, "plugins": plugins}))
        return path

    def macvlan(self, **keys: Any) -> dict[str, Any]:
        """An rdma-macvlan plugin entry for a conflist (no cniVersion/name: the list carries them)."""
        conf = self.config(**keys)
        del conf["cniVersion"], conf["name"]
        return conf

    def client_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "CAP_ARGS", "NETCONFPATH"))}
        env.update(NETCONFPATH=str(self.netconf), CNI_PATH=f"{self.bin_dir}:{REF}", CNI_ARGS=CNI_ARGS)
        env.update(extra)
        return env


@dataclass
class Tool:
    """One CNI client; ``run`` returns the completed process of ``<tool> verb network netns``."""

    name: str
    node: ClientNode
    cnitool: str

    def argv(self, verb: str, network: str, pod: Pod) -> list[str]:
        inside = ["ip", "netns", "exec", self.node.name]
        if self.name == "cni-tool":
            return [*inside, sys.executable, "-m", "rdma_cni.cli.tool", "--cache-dir", str(self.node.cache),
                    verb, network, pod.path]  # fmt: skip
        # cnitool's cache dir is libcni's fixed /var/lib/cni: give it ours in a private mount ns.
        script = 'mount --bind "$1" /var/lib/cni && shift && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                str(self.node.cache), *inside, self.cnitool, verb, network, pod.path]  # fmt: skip

    def run(self, verb: str, network: str, pod: Pod, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(verb, network, pod), env=self.node.client_env(**env),
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip

    def ok(self, verb: str, network: str, pod: Pod, **env: str) -> str:
        proc = self.run(verb, network, pod, **env)
        assert proc.returncode == 0, (
            f"{self.name} {verb} {network} failed (rc {proc.returncode}):\n"
            f"stdout: {proc.stdout.strip()}\nstderr: {proc.stderr.strip()[-2000:]}"
        )
        return proc.stdout


@contextmanager
def client_node() -> Iterator[ClientNode]:
    """Like :func:`netns.node` with this module's prefix and plugin dirs; all removed on exit."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    n = ClientNode(tag=tag, name=f"{PREFIX}{tag}-node", switch=f"{PREFIX}{tag}-sw",
                   tmp=tempfile.mkdtemp(prefix=f"{PREFIX}{tag}-"))  # fmt: skip
    os.makedirs("/var/lib/cni", exist_ok=True)  # the bind-mount target for cnitool's cache
    try:
        for ns in (n.name, n.switch):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # No DAD probes, as in netns.node(): restored IPv6 link-locals settle at once.
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.dad_transmits=0",
               "net.ipv6.conf.default.dad_transmits=0")  # fmt: skip
        n.install_plugins()
        yield n
    finally:
        for pod in n.pods:
            sh("ip", "netns", "del", pod.name, check=False)
        sh("ip", "netns", "del", n.name, check=False)
        sh("ip", "netns", "del", n.switch, check=False)
        shutil.rmtree(n.tmp, ignore_errors=True)


def pod_view(netns: str | int, ifname: str) -> dict[str, Any]:
    """The pod's interface (MAC, MTU, IPv4 addresses) by netns name or by a process in it; {} if absent."""
    enter = ["ip", "-n", netns] if isinstance(netns, str) else ["nsenter", "-t", str(netns), "-n", "ip"]
    links = json.loads(sh(*enter, "-j", "addr", "show").stdout or "[]")
    link = next((x for x in links if x["ifname"] == ifname), None)
    if link is None:
        return {}
    return {
        "mac": link["address"],
        "mtu": link["mtu"],
        "kind": link.get("link_type"),
        "inet": [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"],
    }


def pod_links(netns: str | int) -> set[str]:
    enter = ["ip", "-n", netns] if isinstance(netns, str) else ["nsenter", "-t", str(netns), "-n", "ip"]
    return {str(x["ifname"]) for x in json.loads(sh(*enter, "-j", "link").stdout or "[]")}


@contextmanager
def containerd(n: ClientNode, conf_dir: Path) -> Iterator[Any]:
    """H5's private containerd (tests/cni/test_containerd_cri.py) in ``n``'s netns, CNI ``bin_dir`` =
    ``n.bin_dir``, ``conf_dir`` = ``conf_dir``; yields its CRI client. Sandboxes still live at exit
    are stopped and removed (their DELs give the bonds back), then containerd and its shims stop.

    Imported here, not at module level: that module skips itself when containerd is missing.
    """
    from tests.cni.test_containerd_cri import Containerd, Cri

    class OurContainerd(Containerd):  # same harness, this helper's root dir
        def __init__(self, node: ClientNode) -> None:
            super().__init__(node)  # type: ignore[arg-type]  # uses only .tag, .name and .bin_dir
            self.root = Path(f"/tmp/{PREFIX}ctd-{node.tag}")  # short: socket paths are <= 108 bytes

    ctd = OurContainerd(n)
    cri = None
    try:
        ctd.start(conf_dir)
        cri = Cri(ctd.socket)
        yield cri
    finally:
        if cri is not None:
            cri.cleanup()
        ctd.stop()
        # A sandbox netns containerd made for us and could not remove (it died, say): our ADDs name them.
        for netns in {path for cmd, path, _ in n.calls() if cmd == "ADD" and "/netns/cni-" in path}:
            if os.path.exists(netns):
                sh("ip", "netns", "del", os.path.basename(netns), check=False)


def sandbox_netns(info: dict[str, Any]) -> Pod:
    """The sandbox's netns (containerd made it under /var/run/netns) from PodSandboxStatus's info."""
    for ns in info["runtimeSpec"]["linux"]["namespaces"]:
        if ns["type"] == "network":
            return Pod(os.path.basename(ns["path"]))
    raise AssertionError(f"no network namespace in the sandbox's spec: {info['runtimeSpec']['linux']}")
