"""Every shell block of the docs marked runnable is run for real, and must succeed.

A page marks a block with an HTML comment on the line right before its fence (invisible on the site
and on GitHub), naming where it runs:

    <!-- runnable: node -->      on a simulated RDMA node: the block's commands run as root on a
                                 node whose / holds exactly what the DaemonSet's install container
                                 lays down (scripts/install.sh from the built bundle, exclusive mode,
                                 vpc-cni), over bonds in a network namespace of the test's own
                                 (198.51.100.0/24) with the demo's simulated mlx5 devices, GID tables
                                 and /dev/infiniband nodes; nothing of this machine's own / is seen
    <!-- runnable: repo -->      in a checkout of this repository (read-only commands)

A block followed by ``<!-- output -->`` and a ``text`` fence shows what it prints: each line of it
must appear in the output, in that order (runs of blanks count as one; ``…`` stands for anything).
A node block may also be followed by ``<!-- node-after: absent PATH PATH … -->``: those node paths
must be gone once it ran.

The node is a chroot: the machine's /usr bound read-only, its own /etc, /opt, /var, /run, /sys (the
simulated tree) and /dev (device nodes made for it), entered inside the node's network namespace, a
private mount namespace and a PID namespace of its own, so every mount and process of a block ends
with it and a block can only touch the node's files. The node and its namespaces are removed after
each block, also when it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import install_support
import pytest

pytestmark = pytest.mark.docs

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# scripts/build's bundle, built once per run (tests/install_support.py).
bundle = install_support.bundle

BLOCK = re.compile(
    r"^(?P<indent>[ ]*)<!-- runnable: (?P<env>[\w-]+) -->\n"
    r"(?P=indent)```[^\n]*\n(?P<body>.*?)\n(?P=indent)```[ ]*\n"
    r"(?:\s*<!-- output -->\n(?P=indent)```text\n(?P<output>.*?)\n(?P=indent)```[ ]*\n)?"
    r"(?:\s*<!-- node-after: absent (?P<absent>[^>]*?) -->\n)?",
    re.M | re.S,
)
ENVS = ("node", "repo")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    env: str
    body: str
    output: str
    absent: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def _dedent(text: str, indent: str) -> str:
    return "\n".join(line[len(indent):] if line.startswith(indent) else line for line in text.splitlines())


def blocks() -> list[Block]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for m in BLOCK.finditer(text):
            found.append(Block(
                page=str(page.relative_to(REPO)),
                line=text.count("\n", 0, m.start()) + 1,
                env=m["env"],
                body=_dedent(m["body"], m["indent"]),
                output=_dedent(m["output"] or "", m["indent"]),
                absent=tuple((m["absent"] or "").split()),
            ))
    return found


def test_the_docs_mark_runnable_blocks_and_every_marker_is_read() -> None:
    """A marker the pattern misses (a typo, a fence that is not right after it) would leave its
    block untested: every marker must belong to a block found, and the docs must have some."""
    found = blocks()
    markers = sum(p.read_text().count("<!-- runnable:") for p in DOCS.rglob("*.md"))
    assert markers == len(found), f"{markers} markers, {len(found)} blocks read"
    assert {b.env for b in found} <= set(ENVS), {b.env for b in found}
    assert len([b for b in found if b.env == "node"]) >= 4, [b.name for b in found]


def _normal(line: str) -> str:
    return " ".join(line.split())


def assert_shows(expected: str, out: str, name: str) -> None:
    """Each expected line appears, in order, in some output line (``…``: anything)."""
    lines = [_normal(x) for x in out.splitlines()]
    at = 0
    for want in (w for w in (_normal(x) for x in expected.splitlines()) if w):
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("…")))
        while at < len(lines) and not pattern.search(lines[at]):
            at += 1
        assert at < len(lines), f"{name}: the docs show {want!r}, the command printed:\n{out}"
        at += 1


# ---- the simulated node ---------------------------------------------------------------------------

CLUSTER_NETWORK = """{
  "cniVersion": "1.0.0",
  "name": "tke-route-eni",
  "plugins": [{"type": "ptp", "ipam": {"type": "host-local", "subnet": "203.0.113.0/24"}}]
}
"""


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the simulated node needs root (network namespaces, mounts, chroot)")
    for tool in ("ip", "nsenter", "unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def _make_root(root: Path) -> None:
    """A node's / with nothing of this machine's but /usr (bound read-only when a block runs)."""
    for d in ("usr", "proc", "dev", "sys", "tmp", "root", "run/netns", "var/log", "etc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "var/run").symlink_to("../run")
    for link in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{link}"):
            (root / link).symlink_to(os.readlink(f"/{link}"))
    for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("random", 1, 8), ("urandom", 1, 9)):
        os.mknod(root / "dev" / name, 0o20666, os.makedev(major, minor))
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")


def _used_node_files(root: Path) -> None:
    """What a node that ran RDMA pods keeps beside the installation once they are gone: the plugins'
    logs, their (empty) record dirs and caches, the GID record of the host, the device-info dir."""
    for d in ("var/lib/cni/rdma-macvlan/attachments", "var/lib/cni/rdma-ipvlan", "var/lib/cni/rdma-multus",
              "run/rdma-cni/gid", "run/k8s.cni.cncf.io/devinfo/dp", "var/log/rdma-cni"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "run/rdma-cni/gid/host.json").write_text("{}\n")
    (root / "var/log/rdma-cni/rdma-cni.log").write_text("a pod's ADD and DEL\n")


def _service_account(tmp: Path) -> dict[str, str]:
    """What the install container has that a test has not: a ServiceAccount token (the node's
    kubeconfig is written from it) and the API server's address."""
    sa = tmp / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("a-token\n")
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    return {**os.environ, "RDMA_CNI_SERVICEACCOUNT_DIR": str(sa), "KUBERNETES_SERVICE_HOST": "203.0.113.65"}


@dataclass
class SimNode:
    root: Path
    netns: str

    def run(self, body: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        r = str(self.root)
        enter = (f'mount --bind -o ro /usr "{r}/usr" && mount -t proc proc "{r}/proc" && '
                 f'exec chroot "{r}" /bin/sh -ec "$0"')
        cmd = ["nsenter", f"--net=/run/netns/{self.netns}", "unshare", "--mount", "--pid", "--fork",
               "--propagation", "private", "sh", "-c", enter, body]
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "LANG": "C.UTF-8"}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd="/")


@pytest.fixture
def sim_node(bundle: Path) -> Iterator[SimNode]:
    _need_root()
    from rdma_cni.cli.demo.node import Node

    node = Node(bonds=2, pod_bonds=1, bundle="")
    root = node.tmp / "root"
    try:
        _make_root(root)
        node.sysfs, node.dev_root = str(root / "sys"), str(root / "dev")
        node.build_node()
        with node.rdma():
            install = [str(REPO / "scripts/install.sh"), "--bundle", str(bundle), "--host-root", str(root),
                       "--mode", "vpc-cni", "--rdma-mode", "exclusive", "--kubeconfig-from-serviceaccount"]
            proc = install_support.run(install, env=_service_account(node.tmp))
            assert proc.returncode == 0, proc.stderr
            (root / "etc/cni/net.d/rdma-multus.d/tke-route-eni.conflist").write_text(CLUSTER_NETWORK)
            _used_node_files(root)
            yield SimNode(root, node.node)
    finally:
        node.cleanup()


def _cases(env: str) -> list[Block]:
    return [b for b in blocks() if b.env == env]


@pytest.mark.netns
@pytest.mark.parametrize("block", _cases("node"), ids=lambda b: b.name)
def test_node_block_runs_on_the_simulated_node(block: Block, sim_node: SimNode) -> None:
    proc = sim_node.run(block.body)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{block.name} exited {proc.returncode}:\n{block.body}\n---\n{out}"
    if block.output:
        assert_shows(block.output, out, block.name)
    for path in block.absent:
        assert not os.path.lexists(sim_node.root / path.lstrip("/")), f"{block.name}: {path} is still there"


@pytest.mark.parametrize("block", _cases("repo"), ids=lambda b: b.name)
def test_repo_block_runs_in_the_checkout(block: Block) -> None:
    before = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.body], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{block.name} exited {proc.returncode}:\n{block.body}\n---\n{out}"
    if block.output:
        assert_shows(block.output, out, block.name)
    after = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    assert set(after.splitlines()) <= set(before.splitlines()), f"{block.name} changed the checkout"


def test_a_failing_block_fails_its_test(tmp_path: Path) -> None:
    """The checks above can fail: a block that exits non-zero, and output the docs show that the
    command does not print, are both caught."""
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", "false; echo never"], capture_output=True,
                          text=True)
    assert proc.returncode != 0
    with pytest.raises(AssertionError):
        assert_shows("OK   gid-index-unified", "FAIL gid-index-unified", "example")
    assert_shows("OK gid-index-unified … index 3", "OK   gid-index-unified   all at index 3", "example")


def test_the_uninstall_blocks_kubectl_form_runs_the_same_commands() -> None:
    """The node cleanup is shown twice: on the node (run above) and through ``kubectl debug node``,
    whose pod sees the node's / at /host; the second must run the first's commands, chrooted."""
    text = (DOCS / "uninstall.md").read_text().replace("\\\n", " ")
    node_cmds = [b.body for b in blocks() if b.page == "docs/uninstall.md" and b.env == "node"]
    assert node_cmds, "docs/uninstall.md has no runnable node cleanup"
    debug = re.search(r"kubectl debug node/\S+ [^\n]*-- chroot /host sh -ec '([^']*)'", text)
    assert debug, "docs/uninstall.md shows no kubectl debug node form"
    commands = [_normal(x) for x in node_cmds[0].splitlines() if x.strip() and not x.lstrip().startswith("#")]
    assert [_normal(x) for x in debug.group(1).split(";")] == commands, (debug.group(1), commands)
