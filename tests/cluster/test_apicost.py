"""The pieces of ``scripts/bench-apicost`` (tests/cluster/apicost.py) that need no cluster: the order
of its phases (the fewest DaemonSet rollouts, never DRA back to the device plugin), the pods each
phase starts, the audit log's reading and the table's labels. Pure: no cluster."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import apicost as a
from cluster import dra as d
from cluster.cluster import RDMA


def test_both_modes_take_four_phases_each_switch_changing_one_value() -> None:
    order = a.phases(a.modes("both"))
    assert order == [
        ("devicePlugin", "exclusive"),
        ("devicePlugin", "shared"),
        ("dra", "shared"),
        ("dra", "exclusive"),
    ]
    for (fe1, m1), (fe2, m2) in itertools.pairwise(order):
        assert (fe1 != fe2) + (m1 != m2) == 1, "a switch changes the front end or the mode, not both"
    assert order.index(("dra", "shared")) > order.index(("devicePlugin", "shared"))


@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_one_mode_is_the_device_plugin_then_dra(mode: str) -> None:
    assert a.phases(a.modes(mode)) == [("devicePlugin", mode), ("dra", mode)]


def test_the_help_names_the_modes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        a.main(["--help"])
    assert "--mode {exclusive,shared,both}" in capsys.readouterr().out


def _pod(front_end: str, mode: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(a.pod_doc(front_end, mode)("cost-x-0"))
    assert doc["kind"] == "Pod" and doc["metadata"]["name"] == "cost-x-0"
    return doc


@pytest.mark.parametrize("front_end", ["devicePlugin", "dra"])
def test_exclusive_pods_are_the_seed_pod_and_shared_pods_ask_for_every_bond_shared(front_end: str) -> None:
    seed = _pod(front_end, "exclusive")
    assert seed["metadata"]["annotations"]["tke.cloud.tencent.com/networks"].endswith("tke-rdma-macvlan")
    assert seed["spec"]["containers"][0]["resources"]["limits"][RDMA] in ("4", 4)
    shared = _pod(front_end, "shared")
    annotations = shared["metadata"]["annotations"]
    assert annotations["tke.cloud.tencent.com/networks"] == "tke-route-eni,tke-rdma-ipvlan"
    assert shared["spec"]["terminationGracePeriodSeconds"] == 1
    if front_end == "devicePlugin":
        assert shared["spec"]["containers"][0]["resources"]["limits"] == {RDMA: "1"}
    else:
        template = yaml.safe_load(d.shared_claim_template())
        assert shared["spec"]["resourceClaims"] == [
            {"name": "rdma", "resourceClaimTemplateName": template["metadata"]["name"]}
        ]
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["allocationMode"] == "All"


def _devices(shared: bool, count: int = 8) -> dict[str, dict[str, Any]]:
    extra = {"allowMultipleAllocations": True} if shared else {}
    return {f"bond{b}": {"name": f"bond{b}", **extra} for b in range(count)}


def test_the_slices_count_as_published_only_in_the_modes_form(monkeypatch: pytest.MonkeyPatch) -> None:
    for shared, mode, want in ((False, "exclusive", True), (True, "shared", True), (True, "exclusive", False),
                               (False, "shared", False)):  # fmt: skip
        monkeypatch.setattr(d, "devices", lambda *_, s=shared, **__: _devices(s))
        assert d.published(None, "rdma-node-1", mode) is want  # type: ignore[arg-type]
    monkeypatch.setattr(d, "devices", lambda *_, **__: _devices(False, 7))
    assert not d.published(None, "rdma-node-1", "exclusive")  # type: ignore[arg-type]


def _event(agent: str, verb: str, resource: str, stage: str = "ResponseComplete", **ref: str) -> str:
    return json.dumps(
        {
            "userAgent": f"{agent}/0.1.0",
            "verb": verb,
            "stage": stage,
            "objectRef": {"resource": resource, **ref},
        }
    )


def test_the_audit_log_counts_requests_per_window_and_watches_across_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(a, "FLUSH", 0)
    log = tmp_path / "audit.log"
    log.write_text(_event("rdma-dra-driver", "watch", "resourceslices", "ResponseStarted") + "\n")
    audit = a.AuditLog(log)
    audit.skip()
    with open(log, "a") as f:
        f.write(_event("rdma-multus", "patch", "pods", subresource="status") + "\n")
        f.write(_event("rdma-multus", "patch", "pods", "RequestReceived", subresource="status") + "\n")
        f.write(_event("rdma-dra-driver", "get", "resourceclaims")[:20])  # still being written
    win = audit.read()
    assert a.per([win]) == {"rdma-multus patch pods/status": 1.0}
    assert audit.watches == {"rdma-dra-driver resourceslices": 1}


def _cost(front_end: str, mode: str) -> a.FrontEnd:
    return a.FrontEnd(front_end, mode, {"rdma-multus patch pods/status": 1.0}, {}, {}, {})


def test_the_table_labels_each_row_with_front_end_and_mode_in_a_fixed_order() -> None:
    measured = [_cost(fe, m) for fe, m in a.phases(a.modes("both"))]
    rows = a.in_order(measured)
    assert [r.name for r in rows] == [
        "device plugin (exclusive)",
        "DRA driver (exclusive)",
        "device plugin (shared)",
        "DRA driver (shared)",
    ]
    text = "\n".join(a.table(rows))
    assert (
        "## device plugin (exclusive)\nper pod start: 1.00\n    rdma-multus patch pods/status: 1.00\n" in text
    )
    scale = list(a.at_scale(rows))
    assert scale[3].startswith("DRA driver (shared): 1000 nodes, 50 pod starts/s")
    assert scale[3].endswith("= 50.0 requests/s from the product")
