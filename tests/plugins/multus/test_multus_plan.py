"""Which network gets which interface, and what a plan looks like on disk (no namespaces needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdma_cni.cni.errors import INVALID_CONFIG, STATE_CORRUPT, CniError
from rdma_cni.cni.request import Request
from rdma_cni.plugins.multus.config import parse_config
from rdma_cni.plugins.multus.delegates import Delegate
from rdma_cni.plugins.multus.networks import parse_annotation
from rdma_cni.plugins.multus.plan import AttachmentPlan, PlanStore
from rdma_cni.plugins.multus.plugin import _networks


def assign(
    annotation: str, defaults: str = "tke-route-eni", ifname: str = "eth0"
) -> list[tuple[str, str, bool]]:
    req = Request(command="ADD", cni_version="1.0.0", container_id="c1", ifname=ifname)
    cfg = parse_config({"defaultDelegates": defaults})
    return [
        (w.selection.name, w.ifname, w.is_default) for w in _networks(req, cfg, parse_annotation(annotation))
    ]


def test_tke_form_names_the_default_network_itself() -> None:
    assert assign("tke-route-eni,tke-rdma-macvlan") == [
        ("tke-route-eni", "eth0", True),
        ("tke-rdma-macvlan", "net1", False),
    ]


def test_multus_form_lists_only_extra_networks() -> None:
    assert assign("a,b") == [("tke-route-eni", "eth0", True), ("a", "net1", False), ("b", "net2", False)]


def test_explicit_names_are_kept_and_generated_ones_skip_them() -> None:
    assert assign("a@net1,b,c@rdma0,d") == [
        ("tke-route-eni", "eth0", True),
        ("a", "net1", False),
        ("b", "net2", False),
        ("c", "rdma0", False),
        ("d", "net3", False),
    ]


def test_several_default_delegates_and_the_runtime_ifname() -> None:
    assert assign("x", defaults="tke-bridge,tke-eni", ifname="eth9") == [
        ("tke-bridge", "eth9", True),
        ("tke-eni", "net1", False),
        ("x", "net2", False),
    ]


@pytest.mark.parametrize(
    ("annotation", "needle"),
    [("tke-route-eni@eth5", "always gets CNI_IFNAME"), ("a@eth0", "is the default network's interface")],
)
def test_interface_conflicts_with_the_default_are_refused(annotation: str, needle: str) -> None:
    with pytest.raises(CniError) as exc:
        assign(annotation)
    assert exc.value.code == INVALID_CONFIG and needle in exc.value.msg


def test_plan_round_trips_and_a_torn_file_is_state_corrupt(tmp_path: Path) -> None:
    store = PlanStore(str(tmp_path))
    delegate = Delegate(
        network="tke-rdma-macvlan",
        ifname="net1",
        config=b'{"cniVersion":"1.0.0","name":"tke-rdma-macvlan","plugins":[{"type":"rdma-macvlan"}]}',
        cni_args=[("IgnoreUnknown", "1"), ("K8S_POD_NAME", "p")],
        capability_args={"mac": "02:00:00:00:00:01"},
        injected={0: {"deviceID": "0", "count": 2}},
        runtime_injected={0: {"deviceIDs": ["0", "1"]}},
    )
    plan = AttachmentPlan("c1", "eth0", "/var/run/netns/x", {"name": "p"}, [delegate])
    store.save(plan)
    assert (tmp_path / "attachments" / "c1-eth0.json").stat().st_mode & 0o777 == 0o600
    loaded = store.load("c1", "eth0")
    assert loaded is not None and loaded.delegates == [delegate] and loaded.netns == plan.netns
    assert [p.container_id for p in store.plans()] == ["c1"]
    (tmp_path / "attachments" / "c1-eth0.json").write_text("{")
    with pytest.raises(CniError) as exc:
        store.load("c1", "eth0")
    assert exc.value.code == STATE_CORRUPT
    assert list(store.plans()) == []  # GC skips it (and logs) instead of failing for every pod
    with pytest.raises(CniError):
        store.path("../etc", "eth0")  # a container ID can never escape the cache dir
