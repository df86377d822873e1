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
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from rdma_cni import durable

log = logging.getLogger(__name__)

PREPARING, PREPARED = "preparing", "prepared"
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
        try:
            with open(self.path(uid), encoding="utf-8") as f:
                return _from_doc(json.load(f))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("prepared-claim record of %s is unreadable (%s): preparing it again", uid, e)
            return None

    def put(self, rec: PreparedClaim) -> None:
        durable.atomic_write_json(self.path(rec.uid), asdict(rec), mode=0o600, dir_mode=0o700)

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


def _from_doc(doc: dict[str, Any]) -> PreparedClaim:
    devices = tuple(
        PreparedDevice(d["request"], d["pool"], d["device"], tuple(d["cdi_ids"]), d.get("share_id"))
        for d in doc["devices"]
    )
    if doc["phase"] not in (PREPARING, PREPARED):
        raise ValueError(f"unknown phase {doc['phase']!r}")
    return PreparedClaim(doc["uid"], doc["namespace"], doc["name"], doc["phase"], devices)
