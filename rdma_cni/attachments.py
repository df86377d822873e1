"""What one attachment's node record holds (:class:`AttachmentRecord`, one :class:`BondRecord` per
bond), and which record schemas this code reads and writes. :mod:`rdma_cni.state` keeps them on disk.

Schemas across versions (docs/compatibility-policy.md): a record names the schema of its fields.
This code writes :data:`SCHEMA_VERSION` and reads every schema in :data:`READS_SCHEMAS` (its own
and the previous one; 1 is the first). A record of a newer schema is read only when its writer says
a reader of this schema may use it, ignoring the fields it does not know (``min_reader_schema``).
Any other newer record that names its attachment and bonds (the part every version keeps, see
:func:`envelope_pins`; a file without even that is unreadable, as a torn one) raises
:class:`RecordTooNew`, naming the file, its schema and the fix. It is never treated as absent,
which would let DEL answer success and forget the bonds it holds, or let another ADD take them.
So ``get`` of such an attachment raises (its DEL changes nothing and is retried by the runtime),
``attachments`` under the node lock raises (no ADD or GC decides on a partial view of the node),
and outside the lock it lists the readable records, while ``pins`` still counts the bonds the
newer record names and ``unreadable`` lists it (doctor, metrics).

A re-addressed bond (:func:`address_drift`): when a bond is given back while it holds a global
address its record does not (the node's network config or an operator re-addressed it while a pod
held the old ones), the bond's present configuration is the truth and the record's addresses,
routes and rules are not put back. That decision is noted in ``skipped/<bond>.json`` (what the
record held, what the bond holds) for ``cni-tool state`` and doctor, until the next ADD of the bond.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rdma_cni import __version__
from rdma_cni.cni.errors import STATE_CORRUPT, CniError
from rdma_cni.cni.request import Attachment, validate_container_id, validate_ifname

log = logging.getLogger("rdma_cni.state")

SCHEMA_VERSION = 1  # the schema every record this code writes has
READS_SCHEMAS = (1,)  # what it reads: its own and the previous one (1 is the first schema)
# Written by a newer version into a record of a newer schema: the oldest schema whose reader may use
# the record, ignoring the fields it does not know (what it must understand, it does). Absent: the
# record's own schema.
MIN_READER_KEY = "min_reader_schema"
WRITTEN_BY_KEY = "written_by"  # the rdma-cni version that wrote a record of schema 2 or later
PHASE_ADDING = "adding"  # write-ahead: the host may be partly changed; DEL/GC must undo
PHASE_ADDED = "added"  # ADD returned a result
PHASE_IPAM_PENDING = "ipam-pending"  # the host is given back; only the IPAM release is left (no bonds)


@dataclass
class BondRecord:
    """Everything about one bond of an attachment; ``addresses``/``routes``/``rules`` are rtnl records."""

    bond: str
    bond_index: int
    pod_ifname: str
    temp_name: str
    mtu: int = 0
    mac: str = ""
    addresses: list[dict[str, Any]] = field(default_factory=list)
    routes: list[dict[str, Any]] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    pod_routes: list[dict[str, Any]] = field(default_factory=list)
    pod_rules: list[dict[str, Any]] = field(default_factory=list)
    pod_table: int | None = None  # the bond's own table in the pod; None: the pod's main table
    moves_addresses: bool = True
    rdma: dict[str, Any] | None = None


@dataclass
class AttachmentRecord:
    """One attachment's write-ahead record (see the module doc): all DEL needs to give the host back."""

    container_id: str
    ifname: str
    netns: str
    netns_inode: int
    phase: str = PHASE_ADDING
    cni_version: str = ""
    network: str = ""
    bonds: list[BondRecord] = field(default_factory=list)
    ipam: dict[str, Any] | None = None
    ipam_result: dict[str, Any] | None = None
    # The IFLA_GROUP its pod interfaces are created in (one no other link of that pod netns used
    # when it was chosen): DEL deletes them with one request. 0: none (records of older versions).
    link_group: int = 0
    created: float = field(default_factory=time.time)
    schema: int = SCHEMA_VERSION
    # The pod as the runtime named it in CNI_ARGS (K8S_POD_NAMESPACE/K8S_POD_NAME; "" when it did
    # not): what an operator looks for in cni-tool state and in the agent's metrics labels.
    pod_namespace: str = ""
    pod_name: str = ""

    @property
    def key(self) -> Attachment:
        return Attachment(self.container_id, self.ifname)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view sharing the record's values: written at once, so no deep copy is needed
        (``dataclasses.asdict`` deep-copies every rtnl record; ~0.1 ms per write)."""
        out = dict(vars(self))
        out["bonds"] = [dict(vars(b)) for b in self.bonds]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str = "") -> AttachmentRecord:
        """The record in this code's schema; :class:`RecordTooNew` when its schema is newer and its
        writer did not allow this one to read it; ValueError/TypeError when it is not a record."""
        if not isinstance(data, dict):
            raise ValueError("record is not a JSON object")
        raw = readable_as_current(data, path)
        bonds = [BondRecord(**b) for b in raw.pop("bonds", [])]
        rec = cls(**raw, bonds=bonds)
        validate_container_id(rec.container_id)
        validate_ifname(rec.ifname)
        if rec.phase not in (PHASE_ADDING, PHASE_ADDED, PHASE_IPAM_PENDING):
            raise ValueError(f"unknown phase {rec.phase!r}")
        return rec


class RecordTooNew(CniError):
    """A record of a schema newer than this code reads: a rollback past the version that wrote it.

    Nothing may act on it (giving its bonds back needs fields this code does not know), nor treat
    it as absent: the error names the file, its schema and the way out, and the caller stops
    before it changes anything on the host.
    """

    def __init__(self, path: str, schema: int, written_by: str = "") -> None:
        newer = f"rdma-cni {written_by}" if written_by else "the rdma-cni version that wrote it"
        super().__init__(
            STATE_CORRUPT,
            f"node record {path or '(unnamed)'} has schema {schema}, but this rdma-cni ({__version__}) "
            f"reads schemas {_schemas_text()}: nothing was changed",
            f"roll forward to {newer} or later, which gives this attachment back; or, running that "
            "version, delete the pods whose records these are before rolling back again",
        )
        self.path = path
        self.schema = schema
        self.written_by = written_by


def _schemas_text() -> str:
    return ", ".join(str(v) for v in READS_SCHEMAS)


def _as_schema(value: Any) -> int | None:
    """A schema number as JSON gives it (an int, not a bool); None for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_RECORD_FIELDS = frozenset(AttachmentRecord.__dataclass_fields__)
_BOND_FIELDS = frozenset(BondRecord.__dataclass_fields__)


def readable_as_current(data: dict[str, Any], path: str = "") -> dict[str, Any]:
    """``data`` (a record's JSON object) in :data:`SCHEMA_VERSION`'s shape, or RecordTooNew.

    Schema 1 is the current one and the first, so a record this code reads needs no migration
    yet; a newer record its writer marked readable by this schema loses the fields this code does
    not know (the writer promised they may be ignored; a rewrite here drops them)."""
    schema = _as_schema(data.get("schema"))
    if schema in READS_SCHEMAS:
        return dict(data)
    if schema is None or schema < SCHEMA_VERSION:
        raise ValueError(f"schema {data.get('schema')!r}, this plugin reads {_schemas_text()}")
    floor = _as_schema(data.get(MIN_READER_KEY, schema))
    if floor is None or floor > SCHEMA_VERSION:
        written_by = data.get(WRITTEN_BY_KEY)
        raise RecordTooNew(path, schema, written_by if isinstance(written_by, str) else "")
    log.info(
        "record %s of schema %d read as schema %d, as its writer allows (%s %d)",
        path or "(unnamed)",
        schema,
        SCHEMA_VERSION,
        MIN_READER_KEY,
        floor,
    )
    raw = {k: v for k, v in data.items() if k in _RECORD_FIELDS}
    raw["schema"] = SCHEMA_VERSION
    bonds = data.get("bonds", [])
    if isinstance(bonds, list):
        raw["bonds"] = [
            {k: v for k, v in b.items() if k in _BOND_FIELDS} if isinstance(b, dict) else b for b in bonds
        ]
    return raw


def envelope_pins(data: Any, filename: str) -> tuple[Attachment, list[str]] | None:
    """The attachment and bond names of a record of any schema, or None: the part of a record every
    version keeps (``container_id``, ``ifname``, ``bonds[].bond``), so a record this code cannot
    read still pins its bonds. None unless it names the attachment its file name says."""
    if not isinstance(data, dict) or not isinstance(data.get("bonds"), list):
        return None
    cid, ifname = data.get("container_id"), data.get("ifname")
    bonds = [b.get("bond") for b in data["bonds"] if isinstance(b, dict)]
    if not (isinstance(cid, str) and isinstance(ifname, str)) or not all(isinstance(b, str) for b in bonds):
        return None
    try:
        if record_filename(cid, ifname) != filename:
            return None
    except CniError:
        return None
    return Attachment(cid, ifname), [str(b) for b in bonds]


def recorded_cidrs(b: BondRecord) -> list[str]:
    """The bond's recorded addresses as ``ip/prefixlen`` text, in the record's (add) order."""
    out = []
    for a in b.addresses:
        ip = next((v for k, v in a.get("attrs", ()) if k == "IFA_ADDRESS"), None)
        if ip is not None:
            out.append(f"{ip}/{a.get('prefixlen')}")
    return out


def _canonical(cidr: str) -> str:
    try:
        return str(ipaddress.ip_interface(cidr))
    except ValueError:
        return cidr


@dataclass(frozen=True)
class AddressDrift:
    """A bond's recorded addresses against the global ones it holds now (CIDR text, canonical).

    ``readdressed``: the bond holds an address its record does not — it was re-addressed while a
    pod held the recorded ones, so giving those back could duplicate an IP that is now another
    node's. A bond holding nothing, or only recorded addresses (a crash mid-ADD, the same address
    given back at boot), is not re-addressed: the record is restored as usual.
    """

    recorded: tuple[str, ...]
    current: tuple[str, ...]

    @property
    def foreign(self) -> tuple[str, ...]:
        """What the bond holds that the record does not."""
        mine = set(self.recorded)
        return tuple(c for c in self.current if c not in mine)

    @property
    def missing(self) -> tuple[str, ...]:
        """What the record holds that the bond does not (what a restore would add back)."""
        have = set(self.current)
        return tuple(c for c in self.recorded if c not in have)

    @property
    def readdressed(self) -> bool:
        return bool(self.foreign)


def address_drift(recorded: Iterable[str], current: Iterable[str]) -> AddressDrift:
    """Pure: compare a record's addresses with a bond's present ones (``ip/prefixlen`` strings).

    ``current`` should be the bond's global addresses (every IPv4, IPv6 other than kernel-made
    link-local/SLAAC ones); IPv6 link-locals are ignored here anyway, since every up link has one.
    """
    cur = []
    for c in current:
        text = _canonical(c)
        try:
            if ipaddress.ip_interface(text).is_link_local and ":" in text:
                continue
        except ValueError:
            pass
        cur.append(text)
    return AddressDrift(tuple(_canonical(c) for c in recorded), tuple(dict.fromkeys(cur)))


def bond_drift(b: BondRecord, current: Iterable[str]) -> AddressDrift:
    """:func:`address_drift` of one recorded bond."""
    return address_drift(recorded_cidrs(b), current)


@dataclass
class SkippedRestore:
    """A give-back that left the record's addresses out because the bond was re-addressed."""

    bond: str
    container_id: str
    ifname: str
    recorded: list[str]
    current: list[str]
    routes: int = 0
    rules: int = 0
    time: float = field(default_factory=time.time)

    def describe(self) -> str:
        return (
            f"{self.bond} was re-addressed while container {self.container_id[:12]} ({self.ifname}) "
            f"held {', '.join(self.recorded) or 'nothing'}: it holds {', '.join(self.current)} now, "
            f"so the record's addresses, {self.routes} route(s) and {self.rules} rule(s) were not put back"
        )


_UNQUOTED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def quote_name(name: str) -> str:
    """``urllib.parse.quote(name, safe="")``, the quoting of every name in a file name here, without
    importing urllib.parse: ~3 ms of a cold plugin call's CPU (its named tuples), for a few
    interface names."""
    return "".join(c if c in _UNQUOTED else "".join(f"%{b:02X}" for b in c.encode()) for c in name)


def record_filename(container_id: str, ifname: str) -> str:
    """``<cid>@<quoted ifname>.json``: '@' cannot occur in a valid container ID; the ifname is quoted."""
    validate_container_id(container_id)
    validate_ifname(ifname)
    return f"{container_id}@{quote_name(ifname)}.json"
