"""rdma-multus driven by a real runtime: containerd's CRI plugin, as the kubelet drives it.

A private containerd (Debian's 1.6) runs inside the test's node netns, with its CNI ``conf_dir``
holding only the rdma-multus config and ``bin_dir`` holding rdma-multus and the delegates. This test
plays the kubelet over CRI gRPC: RunPodSandbox (→ CNI ADD, with the pod annotations in
``runtimeConfig["io.kubernetes.cri.pod-annotations"]``), PodSandboxStatus, StopPodSandbox (→ DEL with
the netns) and RemovePodSandbox (→ DEL with an empty netns). The handful of CRI messages are encoded
by hand (proto3 wire format, field numbers from k8s.io/cri-api runtime/v1 api.proto), so only
``grpcio`` is needed, not generated stubs. The sandbox image is built here from Debian's static busybox.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.multus_node import ANNOTATION, CLEAN_NODE, RESOURCE, Node, addrs, links, reachable

pytestmark = pytest.mark.netns

grpc = pytest.importorskip("grpc")
if not shutil.which("containerd") or not shutil.which("runc") or not os.path.exists("/bin/busybox"):
    pytest.skip("needs Debian's containerd, runc and busybox-static", allow_module_level=True)

PAUSE_IMAGE = "localhost/h5-pause:local"


# --- proto3 wire format, just enough for the sandbox calls -------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: bytes | str | int | bool) -> bytes:
    if isinstance(value, bool | int):
        return _varint(number << 3) + _varint(int(value)) if value else b""
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _map(number: int, entries: dict[str, str]) -> bytes:
    return b"".join(_field(number, _field(1, k) + _field(2, v)) for k, v in entries.items())


def _decode(data: bytes) -> dict[int, list[Any]]:
    """Fields by number; length-delimited values stay bytes (decode nested ones again)."""
    out: dict[int, list[Any]] = {}
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 2:
            size, i = _read_varint(data, i)
            value, i = data[i : i + size], i + size
        elif wire == 1:
            value, i = data[i : i + 8], i + 8
        elif wire == 5:
            value, i = data[i : i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


class Cri:
    """The kubelet's side of runtime.v1.RuntimeService, for sandboxes only."""

    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.live: list[str] = []  # sandboxes to stop and remove if the test fails half-way

    def cleanup(self) -> None:
        for sandbox_id in list(self.live):
            try:
                self.stop_pod_sandbox(sandbox_id)
                self.remove_pod_sandbox(sandbox_id)
            except grpc.RpcError:
                pass
        self.channel.close()

    def _call(self, method: str, request: bytes, timeout: float = 90) -> dict[int, list[Any]]:
        rpc = self.channel.unary_unary(f"/runtime.v1.RuntimeService/{method}")
        return _decode(rpc(request, timeout=timeout))

    def version(self) -> str:
        return str(self._call("Version", _field(1, "v1"), timeout=5)[3][0].decode())

    def run_pod_sandbox(self, name: str, namespace: str, uid: str, annotations: dict[str, str]) -> str:
        metadata = _field(1, name) + _field(2, uid) + _field(3, namespace) + _field(4, 0)
        security = _field(1, _field(1, 0))  # namespace_options.network = POD
        config = (
            _field(1, metadata)
            + _field(2, name)
            + _field(3, "/tmp")
            + _map(6, {"k8s-app": "ibv-app"})
            + _map(7, annotations)
            + _field(8, _field(2, security))
        )
        sandbox_id = str(self._call("RunPodSandbox", _field(1, config))[1][0].decode())
        self.live.append(sandbox_id)
        return sandbox_id

    def sandbox_status(self, sandbox_id: str) -> tuple[int, str, dict[str, Any]]:
        """(state, ip, verbose info JSON) — state 0 is SANDBOX_READY."""
        resp = self._call("PodSandboxStatus", _field(1, sandbox_id) + _field(2, True))
        status = _decode(resp[1][0])
        network = _decode(status.get(5, [b""])[0])
        info: dict[str, Any] = {}
        for entry in resp.get(2, []):
            kv = _decode(entry)
            if kv[1][0] == b"info":
                info = json.loads(kv[2][0])
        return status.get(3, [0])[0], network.get(1, [b""])[0].decode(), info

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("StopPodSandbox", _field(1, sandbox_id))

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("RemovePodSandbox", _field(1, sandbox_id))
        if sandbox_id in self.live:
            self.live.remove(sandbox_id)


# --- a sandbox image from busybox, in `docker save` format --------------------------------------------


def pause_image_tar(path: Path) -> None:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tar.gettarinfo("/bin/busybox", arcname="bin/busybox")
        info.uid = info.gid = 0
        with open("/bin/busybox", "rb") as f:
            tar.addfile(info, f)
        for applet in ("sleep", "sh"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/sleep", "86400"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode()  # fmt: skip
    manifest = json.dumps(
        [{"Config": "config.json", "RepoTags": [PAUSE_IMAGE], "Layers": ["layer.tar"]}]
    ).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in (("layer.tar", layer_bytes), ("config.json", config), ("manifest.json", manifest)):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))


# --- containerd in the node netns ----------------------------------------------------------------------


CONFIG_TOML = """\
version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{root}/containerd.sock"
[ttrpc]
  address = "{root}/containerd-ttrpc.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{image}"
  # no CAP_SYS_RESOURCE in this sandbox: the pause process's oom_score_adj -998 would fail in runc
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin_dir}"
    conf_dir = "{conf_dir}"
    max_conf_num = 1
"""


class Containerd:
    def __init__(self, node: Node) -> None:
        # A short root: unix socket paths are limited to 108 bytes.
        self.root = Path(f"/tmp/h5-ctd-{node.tag}")
        self.node = node
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> str:
        return str(self.root / "containerd.sock")

    def start(self, cri_conf_dir: Path) -> None:
        self.root.mkdir(parents=True)
        toml = self.root / "config.toml"
        toml.write_text(CONFIG_TOML.format(root=self.root, image=PAUSE_IMAGE, bin_dir=self.node.bin_dir,
                                           conf_dir=cri_conf_dir))  # fmt: skip
        self.log = open(self.root / "containerd.log", "wb")
        # nsenter, not `ip netns exec`: the latter remounts /sys, hiding the cgroup mounts runc needs.
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{self.node.name}", "containerd", "--config", str(toml)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        for _ in range(200):
            if os.path.exists(self.socket):
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited: {(self.root / 'containerd.log').read_text()[-2000:]}")
            time.sleep(0.1)
        tar = self.root / "pause.tar"
        pause_image_tar(tar)
        subprocess.run(["ctr", "--address", self.socket, "-n", "k8s.io", "images", "import", str(tar)],
                       check=True, capture_output=True)  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if hasattr(self, "log"):
            self.log.close()
        # Sandboxes left by a failed test: their shims and pause processes are ours, by pid file.
        for pidfile in self.root.rglob("*.pid") if self.root.exists() else []:
            try:
                os.kill(int(pidfile.read_text().strip()), 9)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
        subprocess.run(["umount", "-R", str(self.root)], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tag=f"{os.getpid()}-{uuid.uuid4().hex[:6]}", root=tmp_path)
    try:
        n.up()
        yield n
    finally:
        n.down()


def cri_network(node: Node, tmp_path: Path) -> Path:
    """containerd's conf_dir: only the rdma-multus config, declaring the pod-annotations capability."""
    wrapper = node.bin_dir / "rdma-multus"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m rdma_cni.cli.multus\n")
    wrapper.chmod(0o755)
    cri_conf = tmp_path / "cri-net.d"
    cri_conf.mkdir()
    multus_conf = node.config(None)
    # Without this capability containerd (libcni) does not pass the annotations at all.
    multus_conf["capabilities"] = {"io.kubernetes.cri.pod-annotations": True, "portMappings": True}
    (cri_conf / "00-rdma-multus.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "tke-multus", "plugins": [multus_conf]}))  # fmt: skip
    return cri_conf


def pod_links(pid: int) -> set[str]:
    cmd = ["nsenter", "-t", str(pid), "-n", "ip", "-j", "link"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {str(link["ifname"]) for link in json.loads(out)}


def test_containerd_runs_the_tke_networks_from_the_sandbox_annotation(node: Node, tmp_path: Path) -> None:
    cri_conf = cri_network(node, tmp_path)
    uid = str(uuid.uuid4())
    node.checkpoint(uid, ["0", "1"])
    ctd = Containerd(node)
    cri: Cri | None = None
    try:
        ctd.start(cri_conf)
        cri = Cri(ctd.socket)
        assert cri.version()
        sid = cri.run_pod_sandbox("ibv-app-0", "default", uid, {ANNOTATION: "tke-route-eni,tke-rdma-macvlan"})
        state, ip, info = cri.sandbox_status(sid)
        assert state == 0 and ip.startswith("198.51.100.")  # the default network's address is the pod IP
        assert pod_links(int(info["pid"])) == {"lo", "eth0", "net1"}
        assert reachable(node.name, ip)  # the node reaches the pod over the default network
        (add,) = [c for c in node.delegate_calls() if c["cmd"] == "ADD"]
        assert add["ifname"] == "net1" and add["stdin"]["runtimeConfig"]["deviceIDs"] == ["0", "1"]
        assert f"K8S_POD_UID={uid}" in add["args"]

        cri.stop_pod_sandbox(sid)  # DEL with the netns
        cri.remove_pod_sandbox(sid)  # DEL with CNI_NETNS="" and no prevResult
        dels = [c for c in node.delegate_calls() if c["cmd"] == "DEL"]
        assert len(dels) == 1  # the second DEL found nothing recorded: already done
        assert node.leftovers() == CLEAN_NODE
    finally:
        if cri is not None:
            cri.cleanup()  # a failed test still gives its netns and bond IPs back
        ctd.stop()
    assert links(node.name) == CLEAN_NODE["node_links"]


def test_containerd_seed_pod_with_real_rdma_macvlan_moves_and_returns_the_bond_ips(
    node: Node, tmp_path: Path
) -> None:
    node.add_bond("bond1", "198.51.100.130/28", "198.51.100.129/28")
    wrapper = node.bin_dir / "rdma-macvlan"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m rdma_cni.cli.macvlan\n")
    wrapper.chmod(0o755)
    node.network("tke-rdma-macvlan", {"plugins": [{
        "type": "rdma-macvlan", "masters": ["bond0", "bond1"], "resourceName": RESOURCE,
        "rdma": {"required": False}, "dataDir": str(tmp_path / "rm-state"),
        "runDir": str(tmp_path / "rm-run"), "logFile": str(tmp_path / "rdma-macvlan.log")}]})  # fmt: skip
    cri_conf = cri_network(node, tmp_path)
    uid = str(uuid.uuid4())
    node.checkpoint(uid, ["0", "1"])
    host = {"bond0": ["203.0.113.2/24"], "bond1": ["198.51.100.130/28"]}
    ctd = Containerd(node)
    cri: Cri | None = None
    try:
        ctd.start(cri_conf)
        cri = Cri(ctd.socket)
        sid = cri.run_pod_sandbox("ibv-app-0", "default", uid, {ANNOTATION: "tke-route-eni,tke-rdma-macvlan"})
        state, ip, info = cri.sandbox_status(sid)
        assert state == 0 and ip.startswith("198.51.100.")
        pid = int(info["pid"])
        assert pod_links(pid) == {"lo", "eth0", "bond0", "bond1"}
        assert {b: addrs(node.name, b) for b in host} == {"bond0": [], "bond1": []}
        pod_addrs = subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", "-4", "-o", "addr"], check=True,
                                   capture_output=True, text=True).stdout  # fmt: skip
        assert "203.0.113.2/24" in pod_addrs and "198.51.100.130/28" in pod_addrs

        cri.stop_pod_sandbox(sid)
        assert {b: addrs(node.name, b) for b in host} == host
        cri.remove_pod_sandbox(sid)
        assert {b: addrs(node.name, b) for b in host} == host
        assert links(node.name) == {"lo", "bond0", "bond1"}
    finally:
        if cri is not None:
            cri.cleanup()  # a failed test still gives its netns and bond IPs back
        ctd.stop()
