"""The runtime's result cache, in the exact on-disk format of upstream libcni (``cniCacheV1``).

Why the same format: a network added by upstream ``cnitool`` (or containerd, CRI-O — all libcni) must
be deletable by ``cni-tool`` and the other way round, and a meta plugin that caches what it ran can be
inspected with the same tools. One file per attachment::

    <cache_dir>/results/<network>-<containerID>-<ifname>

holding one JSON object with, in this order, ``kind`` ("cniCacheV1"), ``containerId``, ``config`` (the
network config list's bytes, base64 like Go's ``[]byte``), ``ifName``, ``networkName``, ``netns``
(newer libcni; omitted when empty), ``cniArgs`` (list of ``[key, value]`` pairs; omitted when empty),
``capabilityArgs`` (omitted when empty) and ``result`` (the last plugin's result as a JSON object;
omitted when absent). Map keys are sorted and ``<``, ``>``, ``&`` escaped, as Go's encoder does, so a
file we write is byte-for-byte what libcni would write for the same data.

Every name that becomes part of a path is validated first (container ID and interface name by the CNI
rules, the network name by libcni's), so no runtime-supplied string can escape ``results/``. Writes go
through :mod:`rdma_cni.durable` (temp file + fsync + rename), so a crash leaves the old or the new file.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rdma_cni import durable
from rdma_cni.cni import gojson
from rdma_cni.cni.errors import STATE_CORRUPT, CniError
from rdma_cni.cni.request import validate_container_id, validate_ifname, validate_network_name

log = logging.getLogger(__name__)

KIND = "cniCacheV1"
DEFAULT_CACHE_DIR = "/var/lib/cni"
RESULTS_SUBDIR = "results"


@dataclass
class CacheEntry:
    """One cached attachment: what ADD ran with and what it returned (libcni's ``cachedInfo``)."""

    network: str
    container_id: str
    ifname: str
    config: bytes = b""
    netns: str = ""
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        """The file content, byte-compatible with libcni's ``json.Marshal(&cachedInfo)``."""
        parts: list[tuple[str, Any]] = [
            ("kind", KIND),
            ("containerId", self.container_id),
            ("config", base64.b64encode(self.config).decode("ascii")),
            ("ifName", self.ifname),
            ("networkName", self.network),
        ]
        if self.netns:
            parts.append(("netns", self.netns))
        if self.cni_args:
            parts.append(("cniArgs", [[k, v] for k, v in self.cni_args]))
        if self.capability_args:
            parts.append(("capabilityArgs", self.capability_args))
        if self.result:
            parts.append(("result", self.result))
        body = ",".join(f"{gojson.dumps(k)}:{gojson.dumps(v)}" for k, v in parts)
        return ("{" + body + "}").encode()

    @classmethod
    def from_json(cls, data: bytes, source: str = "cache file") -> CacheEntry:
        """Parse a ``cniCacheV1`` file; a legacy file (a bare result) becomes an entry without names.

        Raises CniError(STATE_CORRUPT) naming ``source`` and the bad field.
        """
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CniError(STATE_CORRUPT, f"{source} is not valid JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise CniError(STATE_CORRUPT, f"{source} must hold a JSON object")
        if obj.get("kind") != KIND:
            # Before cniCacheV1, libcni stored the bare result (it still reads those back).
            if "cniVersion" in obj:
                return cls(network="", container_id="", ifname="", result=obj)
            raise CniError(STATE_CORRUPT, f"{source} has kind {obj.get('kind')!r}, expected {KIND!r}")
        return cls(
            network=_field_str(obj, "networkName", source),
            container_id=_field_str(obj, "containerId", source),
            ifname=_field_str(obj, "ifName", source),
            config=_field_config(obj, source),
            netns=_field_str(obj, "netns", source),
            cni_args=_field_args(obj, source),
            capability_args=_field_dict(obj, "capabilityArgs", source) or {},
            result=_field_dict(obj, "result", source),
        )


class ResultCache:
    """The ``<cache_dir>/results`` directory: read, write, delete and list cached attachments."""

    def __init__(self, cache_dir: str = DEFAULT_CACHE_DIR) -> None:
        self.cache_dir = cache_dir
        self.results_dir = os.path.join(cache_dir, RESULTS_SUBDIR)

    def path(self, network: str, container_id: str, ifname: str) -> str:
        """The file of one attachment; every part is validated so the path stays in ``results/``."""
        validate_network_name(network)
        validate_container_id(container_id)
        validate_ifname(ifname)
        return os.path.join(self.results_dir, f"{network}-{container_id}-{ifname}")

    def write(self, entry: CacheEntry) -> str:
        """Atomically (re)write ``entry``'s file (0600 in a 0700 dir, like libcni); returns its path."""
        path = self.path(entry.network, entry.container_id, entry.ifname)
        durable.atomic_write(path, entry.to_json(), mode=0o600, dir_mode=0o700)
        return path

    def read(self, network: str, container_id: str, ifname: str) -> CacheEntry | None:
        """The cached entry, or None when there is none. A file we cannot parse raises STATE_CORRUPT.

        A legacy (bare result) file is returned with the names filled in from the arguments.
        """
        path = self.path(network, container_id, ifname)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        entry = CacheEntry.from_json(data, source=path)
        if not entry.network:
            entry.network, entry.container_id, entry.ifname = network, container_id, ifname
        return entry

    def delete(self, network: str, container_id: str, ifname: str) -> bool:
        """Remove one attachment's file; False when it was not there."""
        return durable.remove(self.path(network, container_id, ifname))

    def entries(self, container_id: str = "", network: str = "") -> Iterator[CacheEntry]:
        """Every readable ``cniCacheV1`` entry, sorted by file name, optionally filtered.

        Like libcni's GetCachedAttachments: unreadable, legacy or foreign files are skipped (and
        logged), because one bad file must not stop a GC of all the others.
        """
        try:
            names = sorted(os.listdir(self.results_dir))
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith("."):  # our own temp files from an interrupted write
                continue
            path = os.path.join(self.results_dir, name)
            try:
                with open(path, "rb") as f:
                    entry = CacheEntry.from_json(f.read(), source=path)
            except (OSError, CniError) as exc:
                log.warning("skipping cache file %s: %s", path, exc)
                continue
            if not entry.network or not entry.ifname:
                continue
            if container_id and entry.container_id != container_id:
                continue
            if network and entry.network != network:
                continue
            yield entry


def _field_str(obj: Mapping[str, Any], key: str, source: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise CniError(STATE_CORRUPT, f"{source}: field '{key}' must be a string")
    return value


def _field_dict(obj: Mapping[str, Any], key: str, source: str) -> dict[str, Any] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CniError(STATE_CORRUPT, f"{source}: field '{key}' must be a JSON object")
    return value


def _field_config(obj: Mapping[str, Any], source: str) -> bytes:
    value = obj.get("config")
    if value is None:
        return b""
    if not isinstance(value, str):
        raise CniError(STATE_CORRUPT, f"{source}: field 'config' must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CniError(STATE_CORRUPT, f"{source}: field 'config' is not valid base64: {exc}") from exc


def _field_args(obj: Mapping[str, Any], source: str) -> list[tuple[str, str]]:
    value = obj.get("cniArgs")
    if value is None:
        return []
    if not isinstance(value, list) or not all(_is_pair(p) for p in value):
        raise CniError(STATE_CORRUPT, f"{source}: field 'cniArgs' must be a list of [key, value] strings")
    return [(p[0], p[1]) for p in value]


def _is_pair(p: Any) -> bool:
    return isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
