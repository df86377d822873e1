"""The durable record of each claim this driver prepared, so that a retry after a crash, a driver
restart or a second call ends in exactly one prepared state.

One file per claim, ``<dir>/<claim uid>.json``, written atomically and synced (:mod:`rdma_cni.durable`):

- ``phase: preparing`` is written *before* the CDI spec (write-ahead): it names what is about to be
  written, so a start after kill -9 knows the spec, if any, is ours and incomplete work;
- ``phase: prepared`` is written after the spec, with the answer kubelet got; a repeated
  NodePrepareResources of the same claim returns it unchanged (no API call, no rewrite).

Unprepare removes the spec, then the record: a crash between leaves a record whose spec is gone,
which the next unprepare (kubelet retries) removes. A CDI spec of ours with no record at all is an
orphan (:func:`orphans`), removed at start.

    records = PreparedClaims("/var/lib/kubelet/plugins/rdma.tke.cloud.tencent.com/claims")
    records.put(PreparedClaim(uid, ns, name, PREPARING, ()))

Schemas across versions (docs/compatibility-policy.md): a record names its schema (``schema``; the
first version wrote none, which is schema 1). This code writes :data:`SCHEMA` and reads
:data:`READS_SCHEMAS`; the previous version reads the fields it knows and ignores ``schema``, so what
this code writes is what it reads. A record of a newer schema is read only when its writer allows
this schema (``min_reader_schema``); any other raises :class:`ClaimRecordTooNew` naming the file,
the schema and the fix, before the driver writes or removes anything of that claim. It is not
"unreadable" (which prepares the claim again and rewrites the record): that would overwrite what a
newer version recorded, and an unprepare would remove a spec whose record it cannot read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from rdma_cni import __version__, durable

log = logging.getLogger(__name__)

PREPARING, PREPARED = "preparing", "prepared"
SCHEMA = 1  # the schema of every record this code writes
READS_SCHEMAS = (1,)  # its own and the previous one (1 is the first; its records have no "schema")
MIN_READER_KEY = "min_reader_schema"  # a newer writer's word: the oldest schema that may read it
WRITTEN_BY_KEY = "written_by"  # the rdma-cni version that wrote a record of schema 2 or later
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    phase: str
    devices: tuple[PreparedDevice, ...]


class ClaimRecordTooNew(Exception):
    """A prepared-claim record of a schema newer than this code reads (a rollback past its writer)."""

    def __init__(self, path: str, schema: int, written_by: str = "") -> None:
        newer = f"rdma-cni {written_by}" if written_by else "the rdma-cni version that wrote it"
        super().__init__(
            f"prepared-claim record {path} has schema {schema}, but this rdma-dra-driver ({__version__}) "
            f"reads schemas {', '.join(map(str, READS_SCHEMAS))}: nothing was changed; roll forward to "
            f"{newer} or later, which prepares and unprepares this claim; or, running that version, delete "
            "the pods holding the claim before rolling back again"
        )
        self.path = path
        self.schema = schema


def valid_uid(uid: str) -> bool:
    """A claim UID as the API gives it (a UUID): also what keeps a file name inside the directory."""
    return bool(_UID.fullmatch(uid))


class PreparedClaims:
    def __init__(self, directory: str) -> None:
        self.dir = directory

    def path(self, uid: str) -> str:
        if not valid_uid(uid):
            raise ValueError(f"not a claim UID: {uid!r}")
        return os.path.join(self.dir, f"{uid}.json")

    def get(self, uid: str) -> PreparedClaim | None:
        """The record of ``uid``; None when there is none or it cannot be read (logged: it is then
        prepared again, which rewrites both)."""
        path = self.path(uid)
        try:
            with open(path, encoding="utf-8") as f:
                return _from_doc(json.load(f), path)
        except FileNotFoundError:
            return None
        except ClaimRecordTooNew:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("prepared-claim record of %s is unreadable (%s): preparing it again", uid, e)
            return None

    def refuse_newer(self, uid: str) -> None:
        """ClaimRecordTooNew when ``uid``'s record is of a schema this code cannot read: unprepare
        asks before it removes the claim's spec. Anything else (no record, a torn one) is fine."""
        try:
            path = self.path(uid)
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):  # none, torn, or not a claim UID (the caller's check says so)
            return
        if isinstance(doc, dict):
            with contextlib.suppress(ValueError):  # no schema number: a torn record, not a newer one
                _check_schema(doc, path)

    def put(self, rec: PreparedClaim) -> None:
        doc = {"schema": SCHEMA, **asdict(rec)}
        durable.atomic_write_json(self.path(rec.uid), doc, mode=0o600, dir_mode=0o700)

    def remove(self, uid: str) -> bool:
        return durable.remove(self.path(uid))

    def sweep_temp(self) -> list[str]:
        """Remove the temp files of record writes a kill cut short (only at start: no write of ours
        runs then); their paths."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        gone = [os.path.join(self.dir, n) for n in names if n.startswith(durable.TEMP_PREFIX)]
        for path in gone:
            durable.remove(path)
        return gone

    def uids(self) -> list[str]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(n[: -len(".json")] for n in names if n.endswith(".json") and valid_uid(n[:-5]))


def _check_schema(doc: dict[str, Any], path: str) -> None:
    """ValueError for a schema that is no number, ClaimRecordTooNew for a newer one this code may
    not read; a newer one whose writer allows this schema is read by the fields this code knows."""
    schema = doc.get("schema", 1)
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise ValueError(f"schema {schema!r} is not a schema number")
    if schema in READS_SCHEMAS:
        return
    floor = doc.get(MIN_READER_KEY, schema)
    if not isinstance(floor, int) or isinstance(floor, bool) or floor > SCHEMA:
        written_by = doc.get(WRITTEN_BY_KEY)
        raise ClaimRecordTooNew(path, schema, written_by if isinstance(written_by, str) else "")


def _from_doc(doc: dict[str, Any], path: str = "") -> PreparedClaim:
    if not isinstance(doc, dict):
        raise TypeError("record is not a JSON object")
    _check_schema(doc, path)
    devices = tuple(
        PreparedDevice(d["request"], d["pool"], d["device"], tuple(d["cdi_ids"]), d.get("share_id"))
        for d in doc["devices"]
    )
    if doc["phase"] not in (PREPARING, PREPARED):
        raise ValueError(f"unknown phase {doc['phase']!r}")
    return PreparedClaim(doc["uid"], doc["namespace"], doc["name"], doc["phase"], devices)
