"""A CNI client that runs chrooted: the agent's worker takes the client's root, not only its namespaces.

Upstream Multus v4.2.3 *thick* runs its delegates with ``chroot("/hostroot")`` (an rbind of the
host's ``/``) inside the Multus container's mount namespace. A worker that only joined that mount
namespace stood at the container's root: its ``/sys`` had no RDMA device (ADD failed with error 7 on
the test cluster) and the plugin's records would have gone to the container's ephemeral files.

Replayed here: the caller unshares a private mount namespace, rbinds ``/`` at a directory, binds the
simulated node's sysfs tree at ``<chroot>/sys`` and other directories at the config's ``dataDir`` and
``runDir`` (so only the chroot's view has the RDMA devices, and records land where only that view puts
them), and runs the client chrooted there. Also: a worker goes back to the agent's root after a call
(a chroot within the agent's own mount namespace does not change the namespace), and a request with
the two namespace descriptors alone (a client from before the root was passed) still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netns as netns_fixtures
import pytest
from netns import Node, PluginResult, Pod, build_c_client, can_run, launch_agent, node, stop_agent
from probe_agent import cni_env, probe_conf, read_json
from simnode import sim_node

from rdma_cni.agent import namespaces
from rdma_cni.sim.sync import wait_watched

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent  # test_agent_probe, the plugin the agent serves

# The caller's side, as Multus thick sets it up: a private mount namespace (``unshare -m``, private
# propagation: nothing reaches the machine's mounts, and all of it goes when the caller exits), "/"
# rbound at the chroot, the simulated sysfs and the view's own state dirs bound into it.
CHROOTED = r"""
set -e
root=$1 sys=$2 data=$3 data_view=$4 run=$5 run_view=$6
shift 6
mount --rbind / "$root"
mount --bind "$sys" "$root/sys"
mount --bind "$data_view" "$root$data"
mount --bind "$run_view" "$root$run"
exec chroot "$root" "$@"
"""

# The Python client as an entry point uses it, but with no in-process fallback: None = not answered.
FORWARD = """
import json, sys
from rdma_cni.agent import client
env, stdin, sock = json.loads(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
answer = client.forward(sys.argv[4], env, stdin, timeout=60, path=sock)
print(json.dumps(None if answer is None else [answer.code, answer.stdout, answer.stderr]))
"""


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("c-client")
    build_c_client(str(out))
    (out / "rdma-macvlan").symlink_to("rdma-cni-client")
    return out


@pytest.fixture
def rdma_node(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Node, str]]:
    """A node netns with three veth "bonds", two of them backing simulated RDMA devices whose sysfs
    tree is at the returned path (not at /sys), and an rdma-agent in the node netns."""
    reason = can_run()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(netns_fixtures, "PREFIX", "h7-")
    with node() as n:
        for i in range(3):
            n.bond(f"bond{i}", f"198.51.100.{16 * i + 2}/28", peer=f"198.51.100.{16 * i + 1}/28")
        root = os.path.join(n.tmp, "sys")
        with sim_node(root, ["bond0", "bond1"], n.name, f"h7-{n.tag}-pod-"):
            env = dict(os.environ, PYTHONPATH=str(REPO))
            agent = launch_agent(
                n.agent_socket,
                os.path.join(n.tmp, "agent.log"),
                "--reconcile-interval",
                "-1",
                netns=n.name,
                env=env,
            )
            try:
                yield n, root
            finally:
                stop_agent(agent)


class View:
    """The chroot's directories: the rbind's mount point and the state dirs only the chroot sees."""

    def __init__(self, n: Node) -> None:
        self.root = os.path.join(n.tmp, "chroot")
        self.data = os.path.join(n.tmp, "chroot-state")
        self.run = os.path.join(n.tmp, "chroot-run")
        for d in (self.root, self.data, self.run, n.data_dir, n.run_dir):
            os.makedirs(d, exist_ok=True)


def chrooted_call(
    n: Node, view: View, sysfs: str, argv: list[str], env: dict[str, str], stdin: bytes
) -> subprocess.CompletedProcess[bytes]:
    """``argv`` run the way Multus thick runs a delegate: in the node netns, in a mount namespace of
    its own, chrooted into an rbind of ``/`` where /sys, dataDir and runDir are other directories."""
    cmd = [
        "ip",
        "netns",
        "exec",
        n.name,
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        CHROOTED,
        "sh",
        view.root,
        sysfs,
        n.data_dir,
        view.data,
        n.run_dir,
        view.run,
        *argv,
    ]
    return subprocess.run(cmd, input=stdin, env=env, capture_output=True, timeout=120, check=False)


def via_c(
    n: Node, view: View, sysfs: str, c_client: Path, command: str, conf: dict[str, Any], pod: Pod
) -> PluginResult:
    env = n.env(
        command,
        pod,
        "c1",
        "net1",
        {
            "RDMA_CNI_AGENT_SOCKET": n.agent_socket,
            "RDMA_CNI_FALLBACK": n.refused(),
            "RDMA_CNI_AGENT_TIMEOUT": "60",
        },
    )
    proc = chrooted_call(n, view, sysfs, [str(c_client / "rdma-macvlan")], env, json.dumps(conf).encode())
    return netns_fixtures._result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def via_python(
    n: Node, view: View, sysfs: str, _c: Path, command: str, conf: dict[str, Any], pod: Pod
) -> PluginResult:
    env = n.env(command, pod, "c1", "net1")
    argv = [sys.executable, "-c", FORWARD, json.dumps(env), json.dumps(conf), n.agent_socket, "rdma-macvlan"]
    proc = chrooted_call(n, view, sysfs, argv, dict(env), b"")
    assert proc.returncode == 0, proc.stderr.decode()
    answer = json.loads(proc.stdout)
    assert answer is not None, "the agent did not answer (refused)"
    code, stdout, stderr = answer
    return netns_fixtures._result(code, stdout, stderr)


def pod_addresses(n: Node, pod: Pod) -> set[str]:
    return {a["local"] for link in n.pod_json(pod, "addr") for a in link.get("addr_info", [])}


@pytest.mark.parametrize("client", [via_c, via_python], ids=["c-client", "python-client"])
def test_a_chrooted_callers_add_and_del_run_in_its_chroot(
    rdma_node: tuple[Node, str], c_client: Path, client: Any
) -> None:
    n, sysfs = rdma_node
    view = View(n)
    before = n.snapshot()
    pod = n.pod()
    wait_watched(f"/run/netns/{n.name}", pod.path)
    # No sysfsRoot: the bonds are the netdevs behind the RDMA devices of /sys, which only the
    # chroot's view has (error 7 "no RDMA device backs a netdev" at the namespace's root).
    conf = n.config(rdma={"required": True, "gidTimeoutMs": 3000}, cniVersion="1.1.0")
    add = client(n, view, sysfs, c_client, "ADD", conf, pod)
    assert add.code == 0, add.stdout + add.stderr
    assert [i["name"] for i in add.out["interfaces"]][:1] == ["bond0"]
    ips = {ip["address"].split("/")[0] for ip in add.out["ips"]}
    assert "198.51.100.2" in ips
    assert ips <= pod_addresses(n, pod)  # the bond's address moved into the pod
    # The records are where the chroot's view puts dataDir and runDir, not at those paths outside it.
    assert os.listdir(os.path.join(view.data, "attachments")), "no record in the chroot's dataDir"
    assert os.path.exists(os.path.join(view.run, "gid", "c1", "bond0.json"))
    assert not os.path.exists(os.path.join(n.data_dir, "attachments"))
    assert os.listdir(n.run_dir) == []
    dele = client(n, view, sysfs, c_client, "DEL", dict(conf, prevResult=add.out), pod)
    assert dele.code == 0, dele.stdout + dele.stderr
    assert "198.51.100.2" not in pod_addresses(n, pod)
    assert n.snapshot() == before  # the bond has its address, routes and rules back
    assert not [f for f in os.listdir(os.path.join(view.data, "attachments")) if f.endswith(".json")]
    served = [
        line for line in Path(n.tmp, "agent.log").read_text().splitlines() if "served rdma-macvlan" in line
    ]
    assert len(served) == 2, served


# --- the worker goes back to the agent's root -----------------------------------------------------

# A client from before the root was passed: the two namespace descriptors only.
OLD_CLIENT = """
import json, os, socket, sys
from rdma_cni.agent import wire
env, stdin, path, plugin = json.loads(sys.argv[1]), sys.argv[2].encode(), sys.argv[3], sys.argv[4]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(60)
sock.connect(path)
fds = [os.open(f"/proc/self/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC) for ns in ("net", "mnt")]
socket.send_fds(sock, [wire.encode_request(plugin, env, stdin) + wire.GO], fds)
ready = sock.recv(1)
answer = wire.decode_answer(wire.recv_frame(sock)) if ready == wire.READY else None
print(json.dumps(answer))
"""


@contextlib.contextmanager
def agent_in_own_mount_namespace(tmp: Path) -> Iterator[tuple[int, str]]:
    """An rdma-agent serving the probe with one worker, in a private mount namespace of its own: the
    mounts a test makes there go with it. Yields (agent pid, socket)."""
    sock, log = str(tmp / "agent.sock"), str(tmp / "agent.log")
    env = dict(os.environ, PYTHONPATH=f"{TESTS}:{REPO}")
    cmd = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        sys.executable,
        "-m",
        "rdma_cni.cli.agent",
        "--socket",
        sock,
        "--reconcile-interval",
        "-1",
        "--prefork",
        "1",
        "--max-workers",
        "1",
        "--plugin",
        "probe=test_agent_probe:SPEC",
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 180
        while not os.path.exists(sock):
            assert proc.poll() is None and time.monotonic() < deadline, Path(log).read_text()[-2000:]
            time.sleep(0.02)
        yield proc.pid, sock
    finally:
        stop_agent(proc)


def in_agent_ns(pid: int, *argv: str, chroot: str = "") -> list[str]:
    return ["nsenter", "-t", str(pid), "-m", *(["chroot", chroot] if chroot else []), *argv]


def run_json(cmd: list[str]) -> Any:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, capture_output=True, timeout=120, check=False, cwd="/", env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


def test_after_a_chrooted_call_the_worker_is_back_at_the_agents_root(tmp_path: Path) -> None:
    """A caller in the agent's own mount namespace but chrooted: only its root differs, which the
    mount namespace's identity does not show. The next call, from an old client (no root passed, so
    the worker does not take one) outside the chroot, must run at the agent's root again."""
    if can_run():
        pytest.skip(can_run())
    out, hidden, root = tmp_path / "out", tmp_path / "hidden", tmp_path / "chroot"
    for d in (out, hidden, root):
        d.mkdir()
    with agent_in_own_mount_namespace(tmp_path) as (pid, sock):
        try:
            for argv in (
                ["mount", "--rbind", "/", str(root)],
                ["mount", "--bind", str(hidden), f"{root}{out}"],
            ):
                subprocess.run(in_agent_ns(pid, *argv), check=True, timeout=30)

            def call(name: str, chroot: str = "", old: bool = False) -> dict[str, Any]:
                """The probe's report; its probeFile path is ``out/name`` in the caller's view."""
                stdin = probe_conf(probeFile=str(out / name)).decode()
                argv = [
                    sys.executable,
                    "-c",
                    OLD_CLIENT if old else FORWARD,
                    json.dumps(cni_env("ADD")),
                    stdin,
                    sock,
                ]
                answer = run_json(in_agent_ns(pid, *argv, "probe", chroot=chroot))
                assert answer is not None and answer[0] == 0, answer
                where, elsewhere = (hidden, out) if chroot else (out, hidden)
                assert not (elsewhere / name).exists(), f"{name} was written outside the caller's view"
                report: dict[str, Any] = json.loads((where / name).read_text())
                return report

            first = call("chrooted.json", chroot=str(root))  # lands in "hidden": the chroot's view
            second = call("old-client.json", old=True)  # at the agent's root again: lands in "out"
            third = call("plain.json")
            assert first["pid"] == second["pid"] == third["pid"]  # one worker served all three
            assert first["mnt"] == second["mnt"] == third["mnt"] == os.stat(f"/proc/{pid}/ns/mnt").st_ino
        finally:
            subprocess.run(in_agent_ns(pid, "umount", "-R", str(root)), check=False, timeout=30)


def test_an_old_clients_request_runs_in_its_namespaces(tmp_path: Path) -> None:
    """Two descriptors (net, mnt), no root: a client from before the root was passed, during a
    rolling update. It runs, in the caller's namespaces, at that mount namespace's root."""
    if can_run():
        pytest.skip(can_run())
    with agent_in_own_mount_namespace(tmp_path) as (_pid, sock):
        marker = tmp_path / "where.json"
        stdin = probe_conf(probeFile=str(marker)).decode()
        answer = run_json(
            [sys.executable, "-c", OLD_CLIENT, json.dumps(cni_env("ADD")), stdin, sock, "probe"]
        )
        assert answer is not None and answer[0] == 0, answer
        where = read_json(marker)
        assert where["mnt"] == os.stat("/proc/self/ns/mnt").st_ino
        assert where["net"] == os.stat("/proc/self/ns/net").st_ino
        assert where["cwd"] == "/"


def test_place_tells_an_rbind_of_root_from_root(tmp_path: Path) -> None:
    """The worker compares roots by (mount id, inode): an rbind of "/" has "/"'s inode and device."""
    if can_run():
        pytest.skip(can_run())
    target = tmp_path / "r"
    target.mkdir()
    script = f"""
import json, os, subprocess
from rdma_cni.agent import namespaces
subprocess.run(["mount", "--rbind", "/", {str(target)!r}], check=True)
fd = os.open({str(target)!r}, os.O_RDONLY | os.O_DIRECTORY)
root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
st, sr = os.fstat(fd), os.fstat(root)
print(json.dumps([namespaces.place(fd) == namespaces.place(), namespaces.place(root) == namespaces.place(),
                  (st.st_dev, st.st_ino) == (sr.st_dev, sr.st_ino)]))
"""
    out = run_json(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", script])
    assert out == [False, True, True]
    assert namespaces.place() is not None  # this kernel says the mount (Linux >= 5.8)
