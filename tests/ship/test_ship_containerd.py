"""The shipped configs under containerd's CRI plugin (Debian's containerd 1.6), as the kubelet drives
it: conf_dir holds conf/vpc-cni's 00-rdma-multus.conflist (paths pointed at the test node, nothing else
changed) and its rdma-multus.d/ delegates; a pod sandbox annotated like the seed's workloads gets eth0
from the cluster network and its two bonds, with the RoCE GID at the host's index; Stop/Remove give
the node back. The node is the demo's simulated GPU node; containerd and the CRI client are H5's
test helpers (tests/cni/test_containerd_cri.py)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from rdma_cni.cli.demo.installed import Demo
from rdma_cni.cli.demo.node import ANNOTATION, bond_addr, gid_index

pytestmark = pytest.mark.netns
ctd_helpers = pytest.importorskip("tests.cni.test_containerd_cri")


@pytest.fixture
def demo_node() -> Iterator[Demo]:
    d = Demo(bonds=2, pod_bonds=2, bundle="")
    d.pods_prefix = "cni-"  # containerd names pod namespaces /var/run/netns/cni-<uuid>
    try:
        d.build_node()
        d.wait_for("carrier", d.bonds_settled)
        with d.rdma():
            d.install_plugins()
            d.write_configs()
            yield d
    finally:
        d.cleanup()


def pod_links(pid: int) -> dict[str, list[str]]:
    out = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "ip", "-4", "-j", "addr"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {a["ifname"]: [x["local"] for x in a["addr_info"]] for a in json.loads(out)}


def test_containerd_runs_the_seed_pod_through_the_shipped_configs(demo_node: Demo) -> None:
    d = demo_node
    uid = str(uuid.uuid4())
    d.write_device_checkpoint(uid)
    before = d.host_snapshot()
    ctd = ctd_helpers.Containerd(
        SimpleNamespace(tag=d.tag.removeprefix("h6-demo-"), bin_dir=d.bin_dir, name=d.node)
    )
    cri = None
    try:
        ctd.start(d.conf_dir)
        cri = ctd_helpers.Cri(ctd.socket)
        sid = cri.run_pod_sandbox("ibv-app-0", "default", uid, {ANNOTATION: "tke-route-eni,tke-rdma-macvlan"})
        state, ip, info = cri.sandbox_status(sid)
        assert state == 0 and ip.startswith("203.0.113."), (state, ip)  # the cluster network's address
        ips = pod_links(int(info["pid"]))
        assert ips["bond0"] == [bond_addr(0)[0].split("/")[0]] and ips["bond1"] == [
            bond_addr(1)[0].split("/")[0]
        ]
        assert not d.host_has("bond0") and not d.host_has("bond1")
        assert gid_index(d, 0) == 3 and gid_index(d, 1) == 3  # the pod's GIDs, at the host's index
        cri.stop_pod_sandbox(sid)
        cri.remove_pod_sandbox(sid)
        assert d.host_snapshot() == before
    finally:
        if cri is not None:
            cri.cleanup()
        ctd.stop()
