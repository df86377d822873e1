"""Node records across versions (docs/compatibility-policy.md, "Node records"): what the previous
version wrote is given back by this one, what this one writes is given back by the previous one,
and a record of a newer schema is refused by name with nothing changed on the host.

The previous version's records are ``fixtures/records-schema1``: the bytes rdma-macvlan wrote at
the commit in its ``COMMIT`` file. The previous version's code is that commit's ``rdma_cni``
package (``git archive``), run as the plugin executable in place of this checkout's.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import compat_node
import previous_version
import pytest
from netns import REPO, Node

from rdma_cni.attachments import PHASE_ADDED, PHASE_ADDING, RecordTooNew
from rdma_cni.cni.errors import STATE_CORRUPT
from rdma_cni.cni.request import Attachment
from rdma_cni.state import COMMIT_SUFFIX, NodeState

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "records-schema1")
RECORD = "compat-n1@net1.json"
CID, IFNAME = "compat-n1", "net1"


def fixture_commit() -> str:
    with open(os.path.join(FIXTURES, "COMMIT")) as f:
        return f.read().strip()


def fixture_bytes(name: str) -> bytes:
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


def install(data_dir: str, write_ahead: bytes, commit: bytes | None) -> str:
    """The records as a node's data dir holds them; the commit re-stamped with the identity of the
    write-ahead file it now sits beside (the only bytes that change: the stamp is the file's inode
    and mtime on the disk it was written to)."""
    d = os.path.join(data_dir, "attachments")
    os.makedirs(d, mode=0o700, exist_ok=True)
    path = os.path.join(d, RECORD)
    with open(path, "wb") as f:
        f.write(write_ahead)
    os.chmod(path, 0o600)
    if commit is not None:
        st = os.stat(path)
        old = json.loads(commit)["writeAhead"]
        stamped = commit.replace(json.dumps(old, separators=(",", ":")).encode(),
                                 json.dumps([st.st_ino, st.st_mtime_ns], separators=(",", ":")).encode())
        assert stamped != commit
        with open(path + COMMIT_SUFFIX, "wb") as f:
            f.write(stamped)
        os.chmod(path + COMMIT_SUFFIX, 0o600)
    return path


def newer(raw: bytes, schema: int = 2, **extra: Any) -> bytes:
    """A record as a later version might write it: schema ``schema``, a field this code does not know."""
    doc = json.loads(raw)
    target = doc["record"] if "record" in doc else doc
    target.update({"schema": schema, "written_by": "0.2.0", "host_vrf": {"name": "vrf-rdma", "table": 77}})
    target.update(extra)
    return json.dumps(doc, separators=(",", ":")).encode()


# ------------------------------------------------------------------ reading, no network needed
def test_the_previous_versions_records_read_as_they_were_written(tmp_path: Any) -> None:
    install(str(tmp_path), fixture_bytes(RECORD), fixture_bytes(RECORD + COMMIT_SUFFIX))
    st = NodeState(str(tmp_path))
    rec = st.get(CID, IFNAME)
    assert rec is not None and rec.phase == PHASE_ADDED  # the commit, not the write-ahead record
    assert [b.bond for b in rec.bonds] == ["bond0", "bond1"]
    assert rec.bonds[0].mac and rec.bonds[0].pod_routes  # what only the commit knows
    assert st.pins() == {"bond0": Attachment(CID, IFNAME), "bond1": Attachment(CID, IFNAME)}
    assert st.unreadable() == []
    os.unlink(st.path(CID, IFNAME) + COMMIT_SUFFIX)
    alone = st.get(CID, IFNAME)
    assert alone is not None and alone.phase == PHASE_ADDING and len(alone.bonds) == 2


def test_this_version_writes_the_fields_the_previous_one_wrote(tmp_path: Any) -> None:
    """Same keys, same schema, record and bonds: the previous version's reader refuses any key it
    does not know (``cls(**raw)``), so a new key would be a new schema."""
    st = NodeState(str(tmp_path))
    install(str(tmp_path), fixture_bytes(RECORD), None)
    rec = st.get(CID, IFNAME)
    assert rec is not None
    st.remove(CID, IFNAME)
    st.put(rec)
    with open(st.path(CID, IFNAME), "rb") as f:
        mine = json.loads(f.read())
    theirs = json.loads(fixture_bytes(RECORD))
    assert mine == theirs
    assert sorted(mine["bonds"][0]) == sorted(theirs["bonds"][0])


def test_a_newer_record_its_writer_marks_readable_is_read_without_the_unknown_fields(tmp_path: Any) -> None:
    raw = newer(fixture_bytes(RECORD), min_reader_schema=1)
    install(str(tmp_path), raw, None)
    st = NodeState(str(tmp_path))
    rec = st.get(CID, IFNAME)
    assert rec is not None and rec.schema == 1 and not hasattr(rec, "host_vrf")
    assert [b.bond for b in rec.bonds] == ["bond0", "bond1"]
    st.put(rec)  # a rewrite here (DEL's ipam-pending, say) is a schema-1 record again
    with open(st.path(CID, IFNAME), "rb") as f:
        assert json.loads(f.read()) == json.loads(fixture_bytes(RECORD))


@pytest.mark.parametrize("newer_files", ["both", "write-ahead alone", "commit"])
def test_a_newer_record_is_refused_by_name_and_still_pins_its_bonds(
    tmp_path: Any, newer_files: str, caplog: pytest.LogCaptureFixture
) -> None:
    """"write-ahead alone": an ADD of the newer version killed before its commit. "commit": a
    schema-1 write-ahead record beside a newer commit, which must not be read as a crashed ADD
    (that would have DEL, GC and reconcile undo a running pod's attachment)."""
    wa, commit = fixture_bytes(RECORD), fixture_bytes(RECORD + COMMIT_SUFFIX)
    if newer_files != "commit":
        wa = newer(wa)
    if newer_files != "write-ahead alone":
        commit = newer(commit)
    path = install(str(tmp_path), wa, commit if newer_files != "write-ahead alone" else None)
    st = NodeState(str(tmp_path))
    with pytest.raises(RecordTooNew) as err:
        st.get(CID, IFNAME)
    named = path + ("" if newer_files == "write-ahead alone" else COMMIT_SUFFIX)
    assert err.value.code == STATE_CORRUPT and err.value.path == named and err.value.schema == 2
    assert f"node record {named} has schema 2" in err.value.msg
    assert "reads schemas 1: nothing was changed" in err.value.msg
    assert "roll forward to rdma-cni 0.2.0 or later" in err.value.details
    with caplog.at_level(logging.ERROR, logger="rdma_cni.state"):
        assert st.attachments() == []  # outside the node lock: doctor, metrics, reconcile
    assert "has schema 2" in caplog.text
    assert st.unreadable() == [path]
    assert st.pins() == {"bond0": Attachment(CID, IFNAME), "bond1": Attachment(CID, IFNAME)}
    with st.locked(), pytest.raises(RecordTooNew):
        st.attachments()  # an ADD or GC deciding
    with st.locked(), pytest.raises(RecordTooNew):
        st.pins()
    assert os.path.exists(path) and os.path.exists(named)


def test_a_newer_schema_without_a_named_attachment_is_an_unreadable_file(tmp_path: Any) -> None:
    """Not even the part every version keeps (container, ifname, bonds): a file, not a record."""
    path = install(str(tmp_path), json.dumps({"schema": 2, "bonds": "?"}).encode(), None)
    st = NodeState(str(tmp_path))
    assert st.get(CID, IFNAME) is None
    with st.locked():
        assert st.attachments() == []
    assert st.unreadable() == [path]


# ------------------------------------------------------------------ giving bonds back, real netns

@pytest.fixture(scope="module")
def previous_code(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The ``rdma_cni`` package of the fixture's commit, unpacked (no worktree, no checkout)."""
    assert fixture_commit() == previous_version.PREVIOUS
    code = previous_version.unpack(str(tmp_path_factory.mktemp("previous")))
    reader = "import rdma_cni.state as s; print(hasattr(s, 'READS_SCHEMAS'))"
    probe = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, cwd=REPO,
                           check=True, timeout=60, env=dict(os.environ, **previous_version.env(code)))
    assert probe.stdout.strip() == "False"  # the reader from before this policy
    return code


@pytest.fixture
def compat_ns(node_ns: Node) -> Iterator[tuple[Node, dict[str, Any]]]:
    yield node_ns, compat_node.build(node_ns)


def record_files(n: Node) -> dict[str, bytes]:
    out = {}
    for name in n.state_files():
        with open(os.path.join(n.data_dir, "attachments", name), "rb") as f:
            out[name] = f.read()
    return out


def assert_given_back(n: Node, before: dict[str, Any]) -> None:
    assert n.snapshot() == before
    assert n.state_files() == []


@pytest.mark.netns
@pytest.mark.parametrize("records", ["committed", "write-ahead"])
@pytest.mark.parametrize("verb", ["DEL", "GC"])
def test_the_previous_versions_records_are_given_back_by_this_one(
    compat_ns: tuple[Node, dict[str, Any]], records: str, verb: str
) -> None:
    n, conf = compat_ns
    before = n.snapshot()
    compat_node.strip(n)
    commit = fixture_bytes(RECORD + COMMIT_SUFFIX) if records == "committed" else None
    install(n.data_dir, fixture_bytes(RECORD), commit)
    assert n.pins() == {"bond0": CID, "bond1": CID}
    if verb == "DEL":
        res = n.plugin("DEL", conf, "", container_id=CID, ifname=IFNAME)
    else:
        res = n.plugin("GC", {**conf, "cni.dev/valid-attachments": []})
    assert res.code == 0, res.stdout + res.stderr
    assert_given_back(n, before)


@pytest.mark.netns
@pytest.mark.parametrize("add_by, del_by", [("previous", "this"), ("this", "previous")])
def test_an_upgrade_or_a_rollback_between_add_and_del_gives_the_bonds_back(
    compat_ns: tuple[Node, dict[str, Any]], previous_code: str, add_by: str, del_by: str
) -> None:
    n, conf = compat_ns
    code = {"previous": previous_version.env(previous_code), "this": {}}
    before = n.snapshot()
    pod = n.pod()
    res = n.plugin("ADD", conf, pod, container_id="skew", extra=code[add_by])
    assert res.code == 0, res.stdout + res.stderr
    assert sorted(n.pins()) == ["bond0", "bond1"]
    n.delete_pod(pod)  # the pod is gone when the other version's DEL comes (a rolled node)
    res = n.plugin("DEL", conf, "", container_id="skew", extra=code[del_by])
    assert res.code == 0, res.stdout + res.stderr
    assert_given_back(n, before)


@pytest.mark.netns
def test_a_newer_record_is_refused_and_nothing_on_the_host_changes(
    compat_ns: tuple[Node, dict[str, Any]]
) -> None:
    """A rollback past the version that wrote a record: DEL of it, any ADD and GC are refused
    naming the record, its schema and the fix; links, addresses, routes, rules and the record stay."""
    n, conf = compat_ns
    n.bond("bond2", "198.51.100.34/28", peer="198.51.100.33/28")  # free: the ADD could take it
    before_add = n.snapshot()
    compat_node.strip(n)
    path = install(n.data_dir, newer(fixture_bytes(RECORD)), newer(fixture_bytes(RECORD + COMMIT_SUFFIX)))
    held = n.snapshot()
    files = record_files(n)
    pod = n.pod()
    answers = {
        "DEL": n.plugin("DEL", conf, "", container_id=CID, ifname=IFNAME),
        "ADD": n.plugin("ADD", {**conf, "masters": ["bond2"], "count": 1}, pod, container_id="new"),
        "GC": n.plugin("GC", {**conf, "cni.dev/valid-attachments": []}),
    }
    for verb, res in answers.items():
        assert res.code != 0, verb
        assert res.out.get("code") == STATE_CORRUPT, (verb, res.stdout)
        assert f"node record {path}" in res.out["msg"] and "has schema 2" in res.out["msg"], verb
        assert "roll forward to rdma-cni 0.2.0 or later" in res.out.get("details", ""), (verb, res.stdout)
    assert n.snapshot() == held
    assert [link["ifname"] for link in n.pod_json(pod, "link")] == ["lo"]
    assert record_files(n) == files
    # Rolled forward (the record's schema is one this code reads again): the same DEL gives it back.
    install(n.data_dir, fixture_bytes(RECORD), fixture_bytes(RECORD + COMMIT_SUFFIX))
    res = n.plugin("DEL", conf, "", container_id=CID, ifname=IFNAME)
    assert res.code == 0, res.stdout + res.stderr
    assert_given_back(n, before_add)
