"""Shared mode's node records (rdma-ipvlan) across versions, as test_compat_records does for
rdma-macvlan: an ADD by one version and its DEL by the other frees the pod's address, and a record
of a newer schema refuses every ADD of the node (the addresses it holds are unknown, so no address
can be chosen) and its own DEL, with the node, the pods and the records left unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import previous_version
import pytest
from ipvlan_support import Shared
from netns import Node

from rdma_cni.cni.errors import STATE_CORRUPT

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def previous_code(tmp_path_factory: pytest.TempPathFactory) -> str:
    return previous_version.unpack(str(tmp_path_factory.mktemp("previous")))


@pytest.fixture
def shared(node_ns: Node) -> Iterator[Shared]:
    s = Shared(node_ns)
    s.bonds(2)
    yield s


def config(shared: Shared) -> dict[str, Any]:
    return shared.config(masters=["bond0", "bond1"])


def rewrite_in_place(path: str, change: Any) -> bytes:
    """The file's JSON through ``change``, written into the same inode with the same mtime: the
    commit beside a write-ahead record names its inode and mtime, and must still match it."""
    st = os.stat(path)
    with open(path, "rb") as f:
        before = f.read()
    with open(path, "wb") as f:
        f.write(json.dumps(change(json.loads(before))).encode())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return before


def as_schema(schema: int) -> Any:
    def change(doc: dict[str, Any]) -> dict[str, Any]:
        target = doc["record"] if "record" in doc else doc
        target["schema"] = schema
        if schema > 1:
            target["written_by"] = "0.2.0"
        return doc
    return change


@pytest.mark.parametrize("add_by, del_by", [("previous", "this"), ("this", "previous")])
def test_an_upgrade_or_a_rollback_between_add_and_del_frees_the_address(
    shared: Shared, previous_code: str, add_by: str, del_by: str
) -> None:
    n = shared.n
    code = {"previous": previous_version.env(previous_code), "this": {}}
    before = n.snapshot()
    pod = n.pod()
    res = shared.plugin("ADD", config(shared), pod, container_id="skew", extra=code[add_by])
    assert res.code == 0, res.stdout + res.stderr
    assert shared.held()  # the pod's address on each bond, recorded
    n.delete_pod(pod)
    res = shared.plugin("DEL", config(shared), "", container_id="skew", extra=code[del_by])
    assert res.code == 0, res.stdout + res.stderr
    assert shared.held() == {} and shared.state_files() == []
    assert n.snapshot() == before


def test_a_newer_record_refuses_every_add_and_its_del_and_nothing_changes(shared: Shared) -> None:
    n = shared.n
    first = n.pod()
    assert shared.plugin("ADD", config(shared), first, container_id="held").code == 0
    files = [os.path.join(shared.data_dir, "attachments", f) for f in shared.state_files()]
    assert sorted(os.path.basename(f) for f in files) == ["held@net1.json", "held@net1.json.added"]
    originals = {path: rewrite_in_place(path, as_schema(2)) for path in files}
    snapshot, held_links = n.snapshot(), shared.pod_links(first)
    newer = {path: open(path, "rb").read() for path in files}
    second = n.pod()
    answers = {
        "ADD": shared.plugin("ADD", config(shared), second, container_id="new"),
        "DEL": shared.plugin("DEL", config(shared), "", container_id="held"),
    }
    for verb, res in answers.items():
        assert res.out.get("code") == STATE_CORRUPT, (verb, res.stdout)
        assert "has schema 2" in res.out["msg"] and "held@net1.json" in res.out["msg"], verb
        assert "roll forward to rdma-cni 0.2.0 or later" in res.out.get("details", ""), verb
    assert n.snapshot() == snapshot
    assert shared.pod_links(second) == ["lo"] and shared.pod_links(first) == held_links
    assert {path: open(path, "rb").read() for path in files} == newer
    for path, raw in originals.items():  # rolled forward: the record is one this code reads again
        rewrite_in_place(path, lambda _doc, raw=raw: json.loads(raw))
    assert shared.plugin("DEL", config(shared), first, container_id="held").code == 0
    assert shared.state_files() == []
