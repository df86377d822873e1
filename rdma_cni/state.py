"""Durable node state of rdma-macvlan: one write-ahead record per attachment, and the node lock.

Layout under ``dataDir`` (0700 dir, 0600 files, every write atomic via :mod:`rdma_cni.durable`)::

    lock                                   fcntl lock: bond selection and record writes, node-wide
    claims/<00..ff>                        fcntl locks: one attachment's whole ADD or DEL (hashed)
    attachments/<containerID>@<ifname>.json   one AttachmentRecord (ifname %-quoted), write-ahead
    attachments/<containerID>@<ifname>.json.added   the same record as ADD committed it

The record is written **before** ADD touches anything and holds all that DEL needs to give the
host back its addresses, routes and rules without the pod netns: so a kill -9 at any point leaves
a record from which DEL or GC restores the node. A bond listed in a record is *pinned* to that
attachment: pins are derived from the records, never stored twice, so they cannot disagree.

Two locks, always taken in this order: an attachment's *claim*, then the node *lock*. ADD holds
its claim for the whole call but the node lock only while it picks bonds and writes the first
write-ahead record; the pins in that record keep other ADDs off its bonds, so the rest (routing
plan, kernel work, commit) runs concurrently. Whoever tears down *another* attachment's record (GC, an
ADD reclaiming a dead netns's bonds) holds the node lock and only *tries* that claim: a busy claim
is an ADD or DEL in flight, skipped, never waited for (no lock-order inversion). Claims hash the
attachment into 256 never-deleted lock files (no unlink race; a collision only serialises two
calls). The record's later writes (the routing plan, what the transaction learns, the commit) need
no node lock: its pins never change after the first write, and only its claim holder writes it.
Their temp files are named after the claim (``.tmpc-<bucket>-*``), so the sweep of what an atomic
write cut short removes one only while that claim is free; a ``.tmp-*`` file is always written
under the node lock, so any one a lock holder finds is an orphan.

Only the write-ahead record is synced to disk (fsync of file and dir, before the host is touched):
it alone decides whether the host gets its addresses back. The committed record (phase "added",
plus what the transaction learned: MAC, pod routes, GID index) is written atomically but not
synced, next to it, stamped with the write-ahead file's identity (inode, mtime): after a power loss
it may be missing or empty, and then the write-ahead record is read instead, a crashed ADD that
DEL/GC/reconcile undo (the pods died with the power anyway). A commit whose stamp does not match
the write-ahead file beside it belongs to an earlier attachment of that name and is ignored.

A file that cannot be read or parsed is treated as absent and logged (never fatal for a pod start);
it is left in place for ``cni-tool state`` / doctor to show.

Public API (read by ``cni-tool state`` and doctor as well as the plugin)::

    st = NodeState("/var/lib/cni/rdma-macvlan")
    with st.claimed(attachment):           # this attachment: its ADD/DEL, taken first, may block
        with st.locked():                  # node-wide exclusive lock (fcntl), held briefly
            st.put(record); st.commit(record); st.get(cid, ifname); st.remove(cid, ifname)
    with st.locked(), st.try_claim(other) as free:   # GC/reclaim: never wait for a claim
        ...
    st.attachments()  -> list[AttachmentRecord]
    st.pins()         -> dict[bond name, Attachment]
    st.unreadable()   -> list[str] paths of files that failed to load
    st.note_skipped(SkippedRestore(...)); st.skipped_restores(); st.clear_skipped(bond)
    st.note_deadlines(bond, notes); st.deadlines(bond)

Finite address lifetimes: a give-back notes, in ``deadlines/<bond>.json``, the deadlines of each
finite address it put back and the kernel's stamp of that add, so the bond's next ADD carries the
first deadlines on instead of the ones the add rounded to (:mod:`rdma_cni.net.lifetimes`). Advisory
like the skipped notes: a lost note costs the address at most half a second, once.

What a record holds, the schemas this code reads and the re-addressed bond rule:
:mod:`rdma_cni.attachments`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rdma_cni import durable
from rdma_cni.attachments import (
    AttachmentRecord,
    RecordTooNew,
    SkippedRestore,
    envelope_pins,
    quote_name,
    record_filename,
)
from rdma_cni.cni.errors import CniError
from rdma_cni.cni.request import Attachment, validate_ifname

log = logging.getLogger("rdma_cni.state")

ATTACHMENTS_DIR = "attachments"
LOCK_FILE = "lock"
CLAIMS_DIR = "claims"
CLAIM_BUCKETS = 256
CLAIMED_TEMP_PREFIX = ".tmpc-"  # + "<bucket:02x>-": an atomic write by a claim holder, no node lock
COMMIT_SUFFIX = ".added"
SKIPPED_DIR = "skipped"
DEADLINES_DIR = "deadlines"


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_mtime_ns]


def _bucket(container_id: str, ifname: str) -> int:
    return zlib.crc32(record_filename(container_id, ifname).encode()) % CLAIM_BUCKETS


def _is_bucket(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdef" for c in text)


def _temp_bucket(name: str) -> int | None:
    """The claim bucket a claim holder's temp file (``.tmpc-<bucket>-*``) names; None for others."""
    if not name.startswith(CLAIMED_TEMP_PREFIX):
        return None
    bucket = name[len(CLAIMED_TEMP_PREFIX) : len(CLAIMED_TEMP_PREFIX) + 2]
    return int(bucket, 16) if _is_bucket(bucket) else None


class NodeState:
    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.dir = os.path.join(data_dir, ATTACHMENTS_DIR)
        self._ensured = False
        self._unreadable: list[str] = []
        # What the last attachments() found of a schema this code cannot read: the error, and the
        # attachment and bonds the record names (its pins).
        self._too_new: list[tuple[RecordTooNew, tuple[Attachment, list[str]]]] = []
        # attachments() as read under the node lock held now (None: not read, or written since).
        # Only lock holders add records, so within one hold the list can only have grown stale by
        # a record a DEL (claim only) removed meanwhile: its bonds look pinned a moment longer, the
        # same as had it been read a moment earlier. ADD reads it twice there (reclaim, then pins),
        # each a JSON load of every record, while every other ADD of the node waits for the lock.
        self._held: list[AttachmentRecord] | None = None
        self._holding = False
        self._claims: set[int] = set()  # the buckets whose claim this object holds now

    def ensure(self) -> None:
        if self._ensured:  # once per call: each ensure_dir is a mkdir and a chmod
            return
        durable.ensure_dir(self.data_dir)
        durable.ensure_dir(self.dir)
        self._ensured = True

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive node-wide lock; released by the kernel even when the holder is kill -9'd."""
        self.ensure()
        fd = os.open(os.path.join(self.data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._holding, self._held = True, None
            self._sweep_temp_files()
            yield
        finally:
            self._holding, self._held = False, None
            os.close(fd)

    @contextmanager
    def claimed(self, att: Attachment) -> Iterator[None]:
        """This attachment's claim, waiting for it; take it *before* :meth:`locked`, never inside."""
        bucket = _bucket(att.container_id, att.ifname)
        fd = self._bucket_fd(bucket)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._claims.add(bucket)
            yield
        finally:
            self._claims.discard(bucket)
            os.close(fd)

    def sweep_claimed(self) -> None:
        """Remove the temp files of the buckets whose claim this process holds: nobody else can write
        one while we hold it and we are not writing now, so each is what a killed earlier holder left
        (an ADD killed mid-commit, whose DEL this is). No node lock needed; the other buckets'
        temp files are the node-lock sweep's."""
        for name in self._temp_names():
            bucket = _temp_bucket(name)
            if bucket is not None and bucket in self._claims:
                self._remove_orphan(name)

    @contextmanager
    def try_claim(self, att: Attachment) -> Iterator[bool]:
        """The claim if it is free right now (True), else False: an ADD or DEL of it is in flight.

        Safe under :meth:`locked` because it never waits. A claim this process already holds (its
        own attachment, or a hash collision with it) counts as busy: flock is per open file.
        """
        with self._try_bucket(_bucket(att.container_id, att.ifname)) as free:
            yield free

    @contextmanager
    def _try_bucket(self, bucket: int) -> Iterator[bool]:
        fd = self._bucket_fd(bucket)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
            else:
                yield True
        finally:
            os.close(fd)

    def _bucket_fd(self, bucket: int) -> int:
        durable.ensure_dir(self.data_dir)
        claims = os.path.join(self.data_dir, CLAIMS_DIR)
        if not os.path.isdir(claims):
            durable.ensure_dir(claims)
        return os.open(os.path.join(claims, f"{bucket:02x}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def sweep(self) -> None:
        """Remove what an atomic write cut short by kill -9 left behind (under the node lock)."""
        with self.locked():
            pass  # locked() sweeps once it holds the lock

    def _sweep_temp_files(self) -> None:
        """Temp files of an atomic write cut short by kill -9. ``.tmp-*`` ones are written only
        under the node lock, which we hold: every one present now is an orphan. A claim holder's
        (``.tmpc-<bucket>-*``) is one only while that claim is free (its writer is gone)."""
        for name in self._temp_names():
            bucket = _temp_bucket(name)
            if bucket in self._claims:  # ours, and we are not writing now (sweep_claimed)
                self._remove_orphan(name)
            elif bucket is not None:
                with self._try_bucket(bucket) as free:  # held while removing
                    if free:
                        self._remove_orphan(name)
            elif name.startswith(durable.TEMP_PREFIX):
                self._remove_orphan(name)

    def _temp_names(self) -> list[str]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return [n for n in names if n.startswith((CLAIMED_TEMP_PREFIX, durable.TEMP_PREFIX))]

    def _remove_orphan(self, name: str) -> None:
        log.info("removing %s/%s left by an interrupted write", self.dir, name)
        durable.remove(os.path.join(self.dir, name))

    def _temp_prefix(self, rec: AttachmentRecord) -> str:
        """Under the node lock the plain temp name; else the writer must hold ``rec``'s claim."""
        if self._holding:
            return durable.TEMP_PREFIX
        return f"{CLAIMED_TEMP_PREFIX}{_bucket(rec.container_id, rec.ifname):02x}-"

    def path(self, container_id: str, ifname: str) -> str:
        return os.path.join(self.dir, record_filename(container_id, ifname))

    def put(self, rec: AttachmentRecord, sync: bool = True) -> None:
        """The write-ahead record, synced: on disk before the caller touches the host. ``sync=False``
        leaves that to :meth:`sync`, so the disk wait can happen after the node lock is released.
        The first write of a record (it pins bonds) needs the node lock; a later one, the record's
        claim alone (module doc)."""
        self.ensure()
        self._held = None
        durable.atomic_write_json(
            self.path(rec.container_id, rec.ifname),
            rec.to_dict(),
            sync=sync,
            temp_prefix=self._temp_prefix(rec),
        )

    def sync(self, rec: AttachmentRecord) -> None:
        durable.sync_path(self.path(rec.container_id, rec.ifname))

    def commit(self, rec: AttachmentRecord) -> None:
        """The record as ADD returns it, beside the write-ahead one and not synced (module doc)."""
        path = self.path(rec.container_id, rec.ifname)
        self._held = None
        body = {"writeAhead": _stamp(os.stat(path)), "record": rec.to_dict()}
        durable.atomic_write_json(path + COMMIT_SUFFIX, body, sync=False, temp_prefix=self._temp_prefix(rec))

    def replace(self, rec: AttachmentRecord) -> None:
        """A smaller record in place of the one on disk (synced), its commit dropped: a DEL that
        gave the host back but could not release the IPAM lease keeps just what the retry needs."""
        self.put(rec)
        try:
            os.unlink(self.path(rec.container_id, rec.ifname) + COMMIT_SUFFIX)
        except FileNotFoundError:
            pass

    def get(self, container_id: str, ifname: str) -> AttachmentRecord | None:
        """The attachment's record; None when there is none (or it is unreadable, logged). Raises
        :class:`RecordTooNew` when it is of a newer schema: DEL must not answer "nothing recorded"."""
        return self._load(self.path(container_id, ifname))

    def remove(self, container_id: str, ifname: str) -> bool:
        """The commit first: a crash in between leaves the write-ahead record, which DEL redoes.
        The record's removal is synced: one that a power loss brought back would make the agent's
        reconcile re-add host addresses and routes the record holds, long after the DEL."""
        path = self.path(container_id, ifname)
        self._held = None
        try:
            os.unlink(path + COMMIT_SUFFIX)
        except FileNotFoundError:
            pass
        removed = durable.remove(path)
        self.sweep_claimed()  # a DEL after an ADD killed mid-commit: that write's temp file goes too
        return removed

    def attachments(self) -> list[AttachmentRecord]:
        """Every readable record. Under the node lock (an ADD or GC about to decide) a record of a
        newer schema raises :class:`RecordTooNew`; outside it (doctor, metrics, reconcile) it is
        left out, listed by :meth:`unreadable`, its bonds still in :meth:`pins`."""
        if self._held is not None:
            return list(self._held)
        self._unreadable, self._too_new = [], []
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if not name.endswith(".json") or name.startswith(".tmp-"):
                continue
            try:
                rec = self._load(os.path.join(self.dir, name))
            except RecordTooNew:
                continue  # noted by _load
            if rec is not None:
                out.append(rec)
        if self._holding and self._too_new:
            raise self._too_new[0][0]
        if self._holding:
            self._held = out
        return list(out)

    def pins(self) -> dict[str, Attachment]:
        """bond -> the attachment it is pinned to, also by a record of a newer schema."""
        out = {b.bond: rec.key for rec in self.attachments() for b in rec.bonds}
        for _, (key, bonds) in self._too_new:
            for bond in bonds:
                out.setdefault(bond, key)
        return out

    def unreadable(self) -> list[str]:
        """Files the last :meth:`attachments` call could not use (for cni-tool state / doctor)."""
        return list(self._unreadable)

    # ------------------------------------------------------------ skipped restores (re-addressed bonds)
    def _skipped_path(self, bond: str) -> str:
        validate_ifname(bond)
        return os.path.join(self.data_dir, SKIPPED_DIR, f"{quote_name(bond)}.json")

    def note_skipped(self, note: SkippedRestore) -> None:
        """Remember (atomically, unsynced: advisory) that a bond's restore was skipped."""
        self.ensure()
        durable.ensure_dir(os.path.join(self.data_dir, SKIPPED_DIR))
        durable.atomic_write_json(self._skipped_path(note.bond), dict(vars(note)), sync=False)

    def clear_skipped(self, bond: str) -> None:
        """The bond was handed out again: its old skipped restore is history."""
        try:
            os.unlink(self._skipped_path(bond))
        except FileNotFoundError:
            pass

    def skipped_restores(self) -> list[SkippedRestore]:
        d = os.path.join(self.data_dir, SKIPPED_DIR)
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".json") and not n.startswith(".tmp-"))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            try:
                with open(os.path.join(d, name), "rb") as f:
                    out.append(SkippedRestore(**json.loads(f.read())))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("skipped-restore note %s/%s unreadable: %s", d, name, exc)
        return out

    # ------------------------------------------------------------ finite lifetimes' deadlines
    def _deadlines_path(self, bond: str) -> str:
        validate_ifname(bond)
        return os.path.join(self.data_dir, DEADLINES_DIR, f"{quote_name(bond)}.json")

    def note_deadlines(self, bond: str, notes: dict[str, Any]) -> None:
        """What a give-back of the bond left (atomically, unsynced: advisory); none: the note goes."""
        if not notes.get("addresses"):
            try:
                os.unlink(self._deadlines_path(bond))
            except FileNotFoundError:
                pass
            return
        self.ensure()
        durable.ensure_dir(os.path.join(self.data_dir, DEADLINES_DIR))
        durable.atomic_write_json(self._deadlines_path(bond), notes, sync=False)

    def deadlines(self, bond: str) -> dict[str, Any]:
        """The bond's last give-back note; {} when there is none or it cannot be read."""
        path = self._deadlines_path(bond)
        try:
            with open(path, "rb") as f:
                notes = json.loads(f.read())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("deadline note %s unreadable: %s", path, exc)
            return {}
        return notes if isinstance(notes, dict) else {}

    def _committed(self, path: str, stamp: list[int]) -> AttachmentRecord | None:
        """The committed record beside ``path`` if it is whole and of this write-ahead record."""
        try:
            with open(path + COMMIT_SUFFIX, "rb") as f:
                body = json.loads(f.read())
            if not isinstance(body, dict) or body.get("writeAhead") != stamp:
                log.info("commit record %s%s is not of this write-ahead record: ignored", path, COMMIT_SUFFIX)
                return None
            return AttachmentRecord.from_dict(body.get("record"), path + COMMIT_SUFFIX)  # type: ignore[arg-type]
        except FileNotFoundError:
            return None
        except RecordTooNew:
            raise  # not a torn commit: the write-ahead record alone would read as a crashed ADD
        except (OSError, ValueError, TypeError, CniError) as exc:  # e.g. emptied by a power loss
            log.warning(
                "commit record %s%s unreadable, using the write-ahead record: %s", path, COMMIT_SUFFIX, exc
            )
            return None

    def _load(self, path: str) -> AttachmentRecord | None:
        data: Any = None
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
                stamp = _stamp(os.fstat(f.fileno()))
            rec = self._committed(path, stamp) or AttachmentRecord.from_dict(data, path)
        except FileNotFoundError:
            return None
        except RecordTooNew as exc:
            self._unreadable.append(path)
            named = envelope_pins(data, os.path.basename(path))
            if named is None:  # not even the part every version keeps: no record of ours
                log.error("state file %s is unreadable, treated as absent: %s", path, exc.msg)
                return None
            log.error("%s; %s", exc.msg, exc.details)
            self._too_new.append((exc, named))
            raise
        except (OSError, ValueError, TypeError, CniError) as exc:
            log.error("state file %s is unreadable, treated as absent: %s", path, exc)
            self._unreadable.append(path)
            return None
        expected = os.path.basename(path)
        if record_filename(rec.container_id, rec.ifname) != expected:
            log.error(
                "state file %s names another attachment (%s, %s): ignored", path, rec.container_id, rec.ifname
            )
            self._unreadable.append(path)
            return None
        return rec
