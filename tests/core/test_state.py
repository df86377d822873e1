"""Durable node state: records, permissions, corrupt files, pins, the node lock."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import time

import pytest

from rdma_cni.attachments import (
    PHASE_ADDED,
    SCHEMA_VERSION,
    AttachmentRecord,
    BondRecord,
    SkippedRestore,
    address_drift,
    bond_drift,
    quote_name,
    record_filename,
)
from rdma_cni.cni.errors import CniError
from rdma_cni.cni.request import Attachment
from rdma_cni.state import NodeState


def rec(cid: str = "c1", ifname: str = "net1", bonds: tuple[str, ...] = ("bond0",)) -> AttachmentRecord:
    return AttachmentRecord(
        container_id=cid, ifname=ifname, netns="/run/netns/x", netns_inode=4026532000,
        bonds=[BondRecord(bond=b, bond_index=3, pod_ifname=b, temp_name="mvtmp0") for b in bonds],
    )


def test_put_get_round_trip_with_private_permissions(tmp_path: str) -> None:
    st = NodeState(os.path.join(tmp_path, "data"))
    r = rec()
    r.bonds[0].addresses = [{"family": 2, "prefixlen": 28, "attrs": [["IFA_ADDRESS", "198.51.100.2"]]}]
    st.put(r)
    got = st.get("c1", "net1")
    assert got == r
    assert stat.S_IMODE(os.stat(st.data_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(st.dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(st.path("c1", "net1")).st_mode) == 0o600
    with open(st.path("c1", "net1")) as f:
        assert json.load(f)["schema"] == SCHEMA_VERSION
    assert st.remove("c1", "net1") is True
    assert st.get("c1", "net1") is None
    assert st.remove("c1", "net1") is False


def test_filenames_are_derived_only_from_validated_ids() -> None:
    assert record_filename("abc", "net1") == "abc@net1.json"
    assert record_filename("abc", "a@b%") == "abc@a%40b%25.json"
    for bad_cid in ("../etc", "a/b", "", "-x"):
        with pytest.raises(CniError):
            record_filename(bad_cid, "net1")
    for bad_if in ("a/b", "..", "x" * 16, "a b"):
        with pytest.raises(CniError):
            record_filename("abc", bad_if)


def test_file_names_are_quoted_as_urllib_quotes_them_so_old_records_keep_their_names() -> None:
    import urllib.parse

    for name in ("bond0", "net1", "a@b%", "a/b", "a b", "A-Z_9.~", "é€😀", "x\x00y", ""):
        assert quote_name(name) == urllib.parse.quote(name, safe=""), name


def test_pins_come_from_the_records(tmp_path: str) -> None:
    st = NodeState(str(tmp_path))
    st.put(rec("c1", "net1", ("bond0", "bond2")))
    st.put(rec("c2", "net1", ("bond1",)))
    assert st.pins() == {
        "bond0": Attachment("c1", "net1"),
        "bond2": Attachment("c1", "net1"),
        "bond1": Attachment("c2", "net1"),
    }


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"", b"[]", json.dumps({"schema": 99}).encode(),
     json.dumps({**rec().to_dict(), "phase": "exploded"}).encode(),
     json.dumps({**rec().to_dict(), "container_id": "../../x"}).encode()],
    # named, not spelled out: the records carry their creation time, and test workers must collect
    # the same test ids
    ids=["not-json", "empty", "list", "schema-99", "phase-exploded", "container-id-escapes"],
)
def test_unreadable_files_are_treated_as_absent_and_logged(
    tmp_path: str, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    st = NodeState(str(tmp_path))
    st.put(rec("good", "net1", ("bond1",)))
    st.ensure()
    bad = st.path("c1", "net1")
    with open(bad, "wb") as f:
        f.write(content)
    with caplog.at_level(logging.ERROR, logger="rdma_cni.state"):
        assert st.get("c1", "net1") is None
        assert [r.container_id for r in st.attachments()] == ["good"]
    assert st.unreadable() == [bad]
    assert "unreadable" in caplog.text
    assert os.path.exists(bad)  # kept for cni-tool state / doctor to show


def test_a_record_under_another_attachments_name_is_ignored(tmp_path: str) -> None:
    st = NodeState(str(tmp_path))
    st.ensure()
    with open(st.path("c9", "net1"), "w") as f:
        json.dump(rec("c1", "net1").to_dict(), f)
    assert st.attachments() == []
    assert st.unreadable() == [st.path("c9", "net1")]


def test_phase_is_recorded(tmp_path: str) -> None:
    st = NodeState(str(tmp_path))
    r = rec()
    st.put(r)
    assert st.get("c1", "net1").phase == "adding"  # type: ignore[union-attr]
    r.phase = PHASE_ADDED
    st.put(r)
    assert st.get("c1", "net1").phase == PHASE_ADDED  # type: ignore[union-attr]


def committed(tmp_path: str, mac: str = "") -> tuple[NodeState, AttachmentRecord]:
    """A record through write-ahead (put) and commit, as ADD writes it."""
    st = NodeState(str(tmp_path))
    r = rec()
    st.put(r)
    r.phase = PHASE_ADDED
    r.bonds[0].mac = mac
    st.commit(r)
    return st, r


def test_commit_sits_beside_the_synced_write_ahead_record_and_both_go_on_remove(tmp_path: str) -> None:
    st, _ = committed(tmp_path, mac="02:00:00:00:00:01")
    got = st.get("c1", "net1")
    assert got is not None and got.phase == PHASE_ADDED and got.bonds[0].mac == "02:00:00:00:00:01"
    with open(st.path("c1", "net1")) as f:
        assert json.load(f)["phase"] == "adding"  # the write-ahead record itself is untouched
    assert [a.phase for a in st.attachments()] == [PHASE_ADDED]
    assert st.remove("c1", "net1")
    assert os.listdir(st.dir) == []


def test_a_commit_emptied_by_a_power_loss_falls_back_to_the_write_ahead_record(tmp_path: str) -> None:
    st, r = committed(tmp_path)
    open(st.path("c1", "net1") + ".added", "w").close()  # what an unsynced rename can leave behind
    got = st.get("c1", "net1")
    assert got is not None and got.phase == "adding" and got.bonds == r.bonds  # DEL/GC can undo it
    assert st.unreadable() == []  # the attachment itself is readable


def test_a_commit_of_an_earlier_write_ahead_record_is_ignored(tmp_path: str) -> None:
    st, _ = committed(tmp_path)
    stale = open(st.path("c1", "net1") + ".added").read()
    st.remove("c1", "net1")
    st.put(rec())  # a new attachment of the same name; the old commit reappears (unsynced unlink)
    with open(st.path("c1", "net1") + ".added", "w") as f:
        f.write(stale)
    got = st.get("c1", "net1")
    assert got is not None and got.phase == "adding"


HOLD = """
import sys, time
from rdma_cni.state import NodeState
with NodeState(sys.argv[1]).locked():
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_node_lock_excludes_other_processes_and_dies_with_its_holder(tmp_path: str) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), "30"], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        waiter = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), "0"], stdout=subprocess.PIPE)
        time.sleep(1.0)
        assert waiter.poll() is None  # blocked on the lock
        holder.kill()  # kill -9: the kernel releases the lock
        out, _ = waiter.communicate(timeout=20)
        assert out == b"held\n" and waiter.returncode == 0
    finally:
        holder.kill()
        holder.wait()


def test_orphaned_temp_files_are_swept_under_the_lock(tmp_path: str) -> None:
    st = NodeState(str(tmp_path))
    st.ensure()
    orphan = os.path.join(st.dir, ".tmp-abc123")
    with open(orphan, "w") as f:
        f.write("{")
    assert st.attachments() == []  # never read as a record
    with st.locked():
        pass
    assert not os.path.exists(orphan)


CLAIM_AND_WRITE = """
import os, sys
from rdma_cni.cni.request import Attachment
from rdma_cni.state import NodeState
st = NodeState(sys.argv[1])
with st.claimed(Attachment(sys.argv[2], sys.argv[3])):
    print("claimed", flush=True)
    sys.stdin.readline()  # hold the claim until told (or killed)
"""


def test_a_claim_holders_temp_file_is_swept_only_once_its_claim_is_free(tmp_path: str) -> None:
    """Writes after the first one (routing plan, commit) take no node lock, only the record's claim:
    a lock holder's sweep must leave such a write's temp file alone while its writer may still
    rename it, and remove it once the writer is gone (kill -9 mid-write)."""
    st = NodeState(str(tmp_path))
    st.ensure()
    r = rec("c9", "net1")
    prefix = st._temp_prefix(r)
    assert prefix.startswith(".tmpc-") and prefix != ".tmpc-"
    pending = os.path.join(st.dir, prefix + "xyz")
    holder = subprocess.Popen([sys.executable, "-c", CLAIM_AND_WRITE, str(tmp_path), "c9", "net1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"claimed\n"
        with open(pending, "w") as f:
            f.write("{")
        with st.locked():
            pass
        assert os.path.exists(pending), "swept while its claim is held: the writer's rename would fail"
        assert st.attachments() == []  # never read as a record
        holder.kill()  # the writer dies mid-write
        holder.wait()
        with st.locked():
            pass
        assert not os.path.exists(pending)
    finally:
        holder.kill()
        holder.wait()


def test_the_del_holding_a_claim_removes_the_temp_file_a_killed_holder_of_it_left(tmp_path: str) -> None:
    """An ADD killed mid-commit leaves ``.tmpc-<its bucket>-*``. Its DEL holds that very claim, so a
    node-lock sweep saw the bucket busy and left the file for some later call: removing the record
    under the claim removes it (nobody else can write in that bucket meanwhile); other buckets'
    temp files are left to the node-lock sweep."""
    st = NodeState(str(tmp_path))
    r, other = rec("c9", "net1"), rec("c8", "net1")
    with st.locked():
        st.put(r)
    left = os.path.join(st.dir, st._temp_prefix(r) + "killed")
    foreign = os.path.join(st.dir, st._temp_prefix(other) + "writing")
    assert st._temp_prefix(r) != st._temp_prefix(other)
    for path in (left, foreign):
        with open(path, "w") as f:
            f.write("{")
    with st.claimed(r.key):
        assert st.remove("c9", "net1")
    assert sorted(os.listdir(st.dir)) == [os.path.basename(foreign)]
    with st.claimed(r.key):  # a DEL that finds no record sweeps under the node lock: its own too
        with open(left, "w") as f:
            f.write("{")
        st.sweep()
    assert not os.path.exists(left)


def test_a_record_written_without_the_node_lock_uses_the_claims_temp_name(tmp_path: str) -> None:
    st = NodeState(str(tmp_path))
    r = rec("c1", "net1")
    with st.locked():
        st.put(r)  # the first write pins: under the lock
    seen: list[str] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(os.path.basename(src))
        real(src, dst)

    try:
        os.replace = spy  # type: ignore[assignment]
        with st.claimed(r.key):
            st.put(r, sync=False)
            st.commit(r)
        with st.locked():
            st.put(r)
    finally:
        os.replace = real  # type: ignore[assignment]
    assert [n.startswith(st._temp_prefix(r)) for n in seen[:2]] == [True, True], seen
    assert seen[2].startswith(".tmp-") and not seen[2].startswith(".tmpc-"), seen
    assert [a.key for a in st.attachments()] == [r.key]


@pytest.mark.parametrize(
    ("current", "readdressed", "missing"),
    [
        ([], False, ["198.51.100.2/28", "2001:db8:1::2/64"]),  # holds nothing: restore all
        (["198.51.100.2/28"], False, ["2001:db8:1::2/64"]),  # a crash mid-ADD: a prefix is left
        (["198.51.100.2/28", "2001:db8:1:0::2/64", "fe80::1/64"], False, []),  # the same, given back
        (["198.51.100.9/28"], True, ["198.51.100.2/28", "2001:db8:1::2/64"]),  # re-addressed
        (["198.51.100.2/24"], True, ["198.51.100.2/28", "2001:db8:1::2/64"]),  # same IP, other subnet
        (["198.51.100.2/28", "2001:db8:1::9/64"], True, ["2001:db8:1::2/64"]),  # one extra address
    ],
)
def test_address_drift_tells_a_readdressed_bond_from_a_crashed_or_restored_one(
    current: list[str], readdressed: bool, missing: list[str]
) -> None:
    b = BondRecord(bond="bond0", bond_index=3, pod_ifname="bond0", temp_name="mvtmp0", addresses=[
        {"family": 2, "prefixlen": 28, "attrs": [["IFA_ADDRESS", "198.51.100.2"]]},
        {"family": 10, "prefixlen": 64, "attrs": [["IFA_ADDRESS", "2001:db8:1::2"]]},
    ])
    drift = bond_drift(b, current)
    assert drift.readdressed is readdressed
    assert list(drift.missing) == missing
    assert drift == address_drift(["198.51.100.2/28", "2001:db8:1::2/64"], current)
    assert "fe80::1/64" not in drift.current


def test_skipped_restores_are_kept_per_bond_until_cleared(tmp_path: str) -> None:
    st = NodeState(os.path.join(tmp_path, "data"))
    assert st.skipped_restores() == []
    note = SkippedRestore("bond0", "c1", "net1", ["198.51.100.2/28"], ["198.51.100.9/28"], routes=2)
    st.note_skipped(note)
    st.note_skipped(SkippedRestore("bond1", "c1", "net1", ["198.51.100.18/28"], ["198.51.100.25/28"]))
    assert [n.bond for n in st.skipped_restores()] == ["bond0", "bond1"]
    assert st.skipped_restores()[0] == note
    assert "198.51.100.9/28" in note.describe() and "2 route(s)" in note.describe()
    st.clear_skipped("bond0")
    st.clear_skipped("bond0")  # idempotent
    assert [n.bond for n in st.skipped_restores()] == ["bond1"]
    with pytest.raises(CniError):
        st.note_skipped(SkippedRestore("../x", "c1", "net1", [], []))
