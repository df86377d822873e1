"""How the chaos run (tests/cluster/chaos.py) classes a pod's life and charges a slow start: what keeps
a lost pod from passing as one Kubernetes refused by design. Pure: no cluster."""

from __future__ import annotations

from collections import Counter

from cluster import faults
from cluster.chaos import ROLLOUT, Life, Plan, Report, _update


def life(**kw: object) -> Life:
    base: dict[str, object] = {"name": "chaos-1", "size": 2, "created": 100.0, "timed": True, "uid": "u1"}
    base.update(kw)
    return Life(**base)  # type: ignore[arg-type]


def report(lives: list[Life], kills: list[faults.Kill]) -> Report:
    return Report(Plan(), lives, kills, [], Counter(), [], Counter(), 1.0)


def pod(phase: str, deleting: bool = False, **status: object) -> dict[str, object]:
    meta: dict[str, object] = {"name": "chaos-1", "uid": "u1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T09:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": "rdma-node-1"}, "status": {"phase": phase, **status}}


def test_a_pod_that_ran_and_went_is_completed_and_one_never_gone_is_lost() -> None:
    assert life(running=101.0, gone=105.0).outcome() == "completed"
    assert life(running=101.0).outcome() == "lost"
    assert life(uid="").outcome() == "never created"


def test_pending_on_insufficient_is_refused_but_bound_and_never_running_for_long_is_lost() -> None:
    refused = life(gone=130.0, unschedulable="0/2 nodes are available: 2 Insufficient nvidia.com/gpu")
    assert refused.outcome() == "refused (Insufficient)"
    assert life(bound=101.0, gone=300.0).outcome() == "lost"
    assert life(bound=101.0, gone=110.0).outcome() == "deleted before running"


def test_failed_after_its_deletion_is_its_end_but_failed_while_alive_is_lost() -> None:
    deleted = life(running=101.0, deleting=102.0, gone=104.0)
    _update(deleted, pod("Failed", deleting=True), 103.0)
    assert deleted.outcome() == "completed"
    alive = life(running=101.0)
    _update(alive, pod("Failed", reason="Evicted", message="out of memory"), 103.0)
    alive.gone = 110.0
    assert alive.outcome() == "lost"


def test_a_kubelet_admission_rejection_is_its_own_class_and_charged_to_the_last_fault_on_its_node() -> None:
    rejected = life(node="rdma-node-2")
    _update(rejected, pod("Failed", reason="UnexpectedAdmissionError", message="no healthy devices"), 120.0)
    rejected.node, rejected.gone = "rdma-node-2", 125.0
    assert rejected.outcome() == "rejected by kubelet at admission"
    kills = [
        faults.Kill(faults.Fault("rdma-device-plugin", 2), 110.0, True),
        faults.Kill(faults.Fault("kubelet", 1), 115.0, True),  # another node: not its cause
        faults.Kill(faults.Fault("rdma-agent", 2), 80.0, True),  # more than 30 s before
    ]
    assert report([rejected], kills).rejection_causes() == Counter({"rdma-device-plugin": 1})
    kills.append(faults.Kill(faults.Fault(ROLLOUT), 118.0, True))
    assert report([rejected], kills).rejection_causes() == Counter({ROLLOUT: 1})


def test_a_start_is_charged_to_a_component_only_when_it_met_that_one_kill() -> None:
    one = life(name="chaos-1", node="rdma-node-1", running=102.0, gone=110.0)
    two = life(name="chaos-2", node="rdma-node-1", created=200.0, running=215.0, gone=220.0)
    kills = [
        faults.Kill(faults.Fault("rdma-agent", 1), 101.0, True),
        faults.Kill(faults.Fault("rdma-agent", 1), 201.0, True),
        faults.Kill(faults.Fault("etcd"), 205.0, True),
        faults.Kill(faults.Fault("rdma-agent", 2), 101.5, True),  # the other node's
        faults.Kill(faults.Fault("rdma-agent", 1), 101.2, False),  # drawn, nothing to kill
    ]
    assert report([one, two], kills).starts_by_fault() == {"rdma-agent": [2.0]}
