"""Address, route and rule messages <-> the records state keeps, by ``struct``; pyroute2 as fallback.

Why by hand: pyroute2's message classes are the reference codec for these records (their attribute
names and value shapes are what state files hold), but they cost ~130-180 us to encode one message
and ~60-100 us to decode one, ~20x and ~10x what this codec takes (scripts/bench-rtcodec). An 8-bond
ADD encodes 32 and decodes ~40: ~10 ms of a ~33 ms call, in the part of the call that every
concurrent ADD of the node also needs the CPU for. This codec covers the attribute types the kernel
reports for IPv4/IPv6 addresses, unicast routes (with metrics) and rules. Anything else -- an
attribute the table below does not know, multipath hops, encapsulation, MPLS, a value of an
unexpected size or shape -- goes to pyroute2 for the whole message, so a record is always what
pyroute2 makes of the message and a replay always sends what pyroute2 sends (tests/net/test_rtcodec.py
compares the two, byte for byte and record for record, on real kernel dumps).

Records: ``{header fields..., "attrs": [[NAME, value], ...]}`` as :func:`rdma_cni.net.rtnl.record`
defines them, except that :func:`decode` keeps every attribute (the caller drops what it does not
store, e.g. ``IFA_CACHEINFO`` after reading the lifetimes from it).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Any

Record = dict[str, Any]

_NLMSGHDR = struct.Struct("=IHHII")
_NLA = struct.Struct("=HH")
_U8, _U16, _U32 = struct.Struct("=B"), struct.Struct("=H"), struct.Struct("=I")
_IFA_CACHEINFO = struct.Struct("=IIII")
_RANGE32, _RANGE16 = struct.Struct("=II"), struct.Struct("=HH")
_IFA_CACHEINFO_KEYS = ("ifa_preferred", "ifa_valid", "cstamp", "tstamp")
_RTA_CACHEINFO = struct.Struct("=IIiIIIII")
_RTA_CACHEINFO_KEYS = (
    "rta_clntref", "rta_lastuse", "rta_expires", "rta_error", "rta_used", "rta_id", "rta_ts", "rta_tsage",
)
RT_TABLE_COMPAT = 252

# kind -> (header struct, header field names in struct order; None = reserved byte, sent as 0)
_HEADERS: dict[str, tuple[struct.Struct, tuple[str | None, ...]]] = {
    "addr": (struct.Struct("=BBBBI"), ("family", "prefixlen", "flags", "scope", "index")),
    "route": (struct.Struct("=BBBBBBBBI"),
              ("family", "dst_len", "src_len", "tos", "table", "proto", "scope", "type", "flags")),
    "rule": (struct.Struct("=BBBBBBBBI"),
             ("family", "dst_len", "src_len", "tos", "table", None, None, "action", "flags")),
}
# The header fields a record keeps (the reserved bytes are not among them), in wire order.
HEADER_FIELDS = {kind: tuple(n for n in names if n is not None) for kind, (_, names) in _HEADERS.items()}


_Codec = tuple[Callable[[bytes], Any], Callable[[Any], bytes]]  # (payload -> value, value -> payload)


class Unsupported(Exception):
    """The message or record holds something this codec does not handle: use pyroute2."""


# --- value codecs: (decode payload -> value, encode value -> payload) ---------------------------


def _ip_decode(payload: bytes) -> str:
    if len(payload) == 4:
        return socket.inet_ntop(socket.AF_INET, payload)
    if len(payload) == 16:
        return socket.inet_ntop(socket.AF_INET6, payload)
    raise Unsupported("address of unexpected size")


def _ip_encode(value: Any) -> bytes:
    if not isinstance(value, str):
        raise Unsupported("address is not text")
    try:
        return socket.inet_pton(socket.AF_INET6 if ":" in value else socket.AF_INET, value)
    except OSError as exc:
        raise Unsupported(str(exc)) from exc


def _uint(codec: struct.Struct) -> _Codec:
    def decode(payload: bytes) -> int:
        if len(payload) != codec.size:
            raise Unsupported("integer of unexpected size")
        return int(codec.unpack(payload)[0])

    def encode(value: Any) -> bytes:
        if type(value) is not int:
            raise Unsupported("integer attribute is not an int")
        try:
            return codec.pack(value)
        except struct.error as exc:
            raise Unsupported(str(exc)) from exc

    return decode, encode


def _text_decode(payload: bytes) -> str:
    if not payload.endswith(b"\0") or b"\0" in payload[:-1]:
        raise Unsupported("string not terminated once")
    try:
        return payload[:-1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unsupported(str(exc)) from exc


def _text_encode(value: Any) -> bytes:
    if not isinstance(value, str):
        raise Unsupported("string attribute is not text")
    return value.encode("utf-8") + b"\0"


def _struct(codec: struct.Struct, keys: tuple[str, ...]) -> _Codec:
    """A fixed C struct shown as a dict of its fields (the cacheinfo attributes)."""

    def decode(payload: bytes) -> dict[str, int]:
        if len(payload) != codec.size:
            raise Unsupported("struct of unexpected size")
        return dict(zip(keys, codec.unpack(payload), strict=True))

    def encode(value: Any) -> bytes:
        if not isinstance(value, dict) or set(value) != set(keys):
            raise Unsupported("struct is not exactly its fields")
        return _pack_fields(codec, value, keys)

    return decode, encode


def _hex_decode(payload: bytes) -> str:
    return ":".join(f"{c:02x}" for c in payload)


def _hex_encode(value: Any) -> bytes:
    raise Unsupported("opaque attribute")  # only ever decoded (RTA_EXPIRES: never stored)


def _pack_fields(codec: struct.Struct, value: dict[str, Any], keys: tuple[str, ...]) -> bytes:
    try:
        return codec.pack(*(value[k] for k in keys))
    except (struct.error, TypeError) as exc:
        raise Unsupported(str(exc)) from exc


def _range(codec: struct.Struct) -> _Codec:
    """pyroute2 shows FRA_*_RANGE as "start:end"."""

    def decode(payload: bytes) -> str:
        if len(payload) != codec.size:
            raise Unsupported("range of unexpected size")
        start, end = codec.unpack(payload)
        return f"{start}:{end}"

    def encode(value: Any) -> bytes:
        try:
            start, end = (int(x) for x in str(value).split(":"))
            return codec.pack(start, end)
        except (ValueError, struct.error) as exc:
            raise Unsupported(str(exc)) from exc

    return decode, encode


_IP = (_ip_decode, _ip_encode)
_TEXT = (_text_decode, _text_encode)
_UINT8, _UINT16, _UINT32 = _uint(_U8), _uint(_U16), _uint(_U32)

# RTAX_*: the nested attributes of RTA_METRICS (uint32 each but the congestion control's name).
_Table = dict[int, tuple[str, _Codec]]
_METRICS: _Table = {
    i: (name, _UINT32) for i, name in enumerate(
        ("RTAX_UNSPEC", "RTAX_LOCK", "RTAX_MTU", "RTAX_WINDOW", "RTAX_RTT", "RTAX_RTTVAR", "RTAX_SSTHRESH",
         "RTAX_CWND", "RTAX_ADVMSS", "RTAX_REORDERING", "RTAX_HOPLIMIT", "RTAX_INITCWND", "RTAX_FEATURES",
         "RTAX_RTO_MIN", "RTAX_INITRWND", "RTAX_QUICKACK")
    ) if i
}
_METRICS[16] = ("RTAX_CC_ALGO", _TEXT)
_METRICS_BY_NAME = {name: (i, codec) for i, (name, codec) in _METRICS.items()}


def _metrics_decode(payload: bytes) -> dict[str, Any]:
    return {"attrs": [[name, value] for name, value in _decode_attrs(payload, 0, len(payload), _METRICS)]}


def _metrics_encode(value: Any) -> bytes:
    if not isinstance(value, dict) or set(value) != {"attrs"}:
        raise Unsupported("metrics are not {'attrs': [...]}")
    return _encode_attrs(value["attrs"], _METRICS_BY_NAME)


_ATTRS: dict[str, _Table] = {
    "addr": {
        1: ("IFA_ADDRESS", _IP), 2: ("IFA_LOCAL", _IP), 3: ("IFA_LABEL", _TEXT), 4: ("IFA_BROADCAST", _IP),
        5: ("IFA_ANYCAST", _IP), 6: ("IFA_CACHEINFO", _struct(_IFA_CACHEINFO, _IFA_CACHEINFO_KEYS)),
        7: ("IFA_MULTICAST", _IP), 8: ("IFA_FLAGS", _UINT32), 9: ("IFA_RT_PRIORITY", _UINT32),
        11: ("IFA_PROTO", _UINT8),
    },
    "route": {
        1: ("RTA_DST", _IP), 2: ("RTA_SRC", _IP), 3: ("RTA_IIF", _UINT32), 4: ("RTA_OIF", _UINT32),
        5: ("RTA_GATEWAY", _IP), 6: ("RTA_PRIORITY", _UINT32), 7: ("RTA_PREFSRC", _IP),
        8: ("RTA_METRICS", (_metrics_decode, _metrics_encode)), 10: ("RTA_PROTOINFO", _UINT32),
        11: ("RTA_FLOW", _UINT32), 12: ("RTA_CACHEINFO", _struct(_RTA_CACHEINFO, _RTA_CACHEINFO_KEYS)),
        15: ("RTA_TABLE", _UINT32), 16: ("RTA_MARK", _UINT32),
        19: ("RTA_NEWDST", _IP), 20: ("RTA_PREF", _UINT8), 21: ("RTA_ENCAP_TYPE", _UINT16),
        23: ("RTA_EXPIRES", (_hex_decode, _hex_encode)),
    },
    "rule": {
        1: ("FRA_DST", _IP), 2: ("FRA_SRC", _IP), 3: ("FRA_IIFNAME", _TEXT), 4: ("FRA_GOTO", _UINT32),
        6: ("FRA_PRIORITY", _UINT32), 10: ("FRA_FWMARK", _UINT32), 11: ("FRA_FLOW", _UINT32),
        13: ("FRA_SUPPRESS_IFGROUP", _UINT32), 14: ("FRA_SUPPRESS_PREFIXLEN", _UINT32),
        15: ("FRA_TABLE", _UINT32), 16: ("FRA_FWMASK", _UINT32), 17: ("FRA_OIFNAME", _TEXT),
        19: ("FRA_L3MDEV", _UINT8), 20: ("FRA_UID_RANGE", _range(_RANGE32)), 21: ("FRA_PROTOCOL", _UINT8),
        22: ("FRA_IP_PROTO", _UINT8), 23: ("FRA_SPORT_RANGE", _range(_RANGE16)),
        24: ("FRA_DPORT_RANGE", _range(_RANGE16)),
    },
}
_BY_NAME = {kind: {name: (i, codec) for i, (name, codec) in table.items()} for kind, table in _ATTRS.items()}
_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def _decode_attrs(data: bytes, offset: int, end: int, table: _Table) -> list[tuple[str, Any]]:
    out = []
    while offset + _NLA.size <= end:
        size, kind = _NLA.unpack_from(data, offset)
        if size < _NLA.size or offset + size > end:
            raise Unsupported("malformed attribute")
        entry = table.get(kind)
        if entry is None:  # unknown here, or with flag bits (nested / byte order): pyroute2's call
            raise Unsupported(f"attribute {kind}")
        out.append((entry[0], entry[1][0](data[offset + _NLA.size : offset + size])))
        offset += (size + 3) & ~3
    return out


def _encode_attrs(attrs: Any, by_name: dict[str, tuple[int, _Codec]]) -> bytes:
    parts = []
    for item in attrs:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise Unsupported("attribute is not a [name, value] pair")
        entry = by_name.get(item[0])
        if entry is None:
            raise Unsupported(f"attribute {item[0]!r}")
        payload = entry[1][1](item[1])
        size = _NLA.size + len(payload)
        parts.append(_NLA.pack(size, entry[0]) + payload + b"\0" * (-size & 3))
    return b"".join(parts)


def decode(kind: str, data: bytes) -> Record:
    """A whole netlink message (header included) -> its record with every attribute. Raises
    :class:`Unsupported` for what pyroute2 must decode."""
    codec, names = _HEADERS[kind]
    start = _NLMSGHDR.size
    end = _NLMSGHDR.unpack_from(data)[0]
    if end > len(data) or end < start + codec.size:
        raise Unsupported("truncated message")
    values = codec.unpack_from(data, start)
    rec: Record = {name: value for name, value in zip(names, values, strict=True) if name is not None}
    if kind != "addr" and rec["family"] not in _FAMILIES:
        raise Unsupported("not an IP route or rule")  # e.g. MPLS: RTA_DST is a label stack then
    attrs = _decode_attrs(data, start + codec.size, end, _ATTRS[kind])
    rec["attrs"] = [[name, value] for name, value in attrs]
    return rec


def encode(kind: str, rec: Record, msg_type: int, flags: int, seq: int) -> bytes:
    """A record -> the request pyroute2 would send for it. Raises :class:`Unsupported` otherwise."""
    codec, names = _HEADERS[kind]
    fields = []
    for name in names:
        value = 0 if name is None else rec.get(name, 0)
        if type(value) is not int:
            raise Unsupported(f"header field {name} is not an int")
        if kind == "route" and name == "table" and value > 255:
            value = RT_TABLE_COMPAT  # as pyroute2 does; the real table goes in RTA_TABLE
        fields.append(value)
    if kind != "addr" and rec.get("family", 0) not in _FAMILIES:
        raise Unsupported("not an IP route or rule")
    try:
        header_fields = codec.pack(*fields)
    except struct.error as exc:
        raise Unsupported(str(exc)) from exc
    body = header_fields + _encode_attrs(rec.get("attrs", ()), _BY_NAME[kind])
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, flags, seq, 0) + body
