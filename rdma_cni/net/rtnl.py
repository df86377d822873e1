"""rtnetlink messages as plain, JSON-safe records, and replaying them exactly.

Snapshots of a bond's addresses, routes and rules are stored in durable state as the kernel's own
message (header fields + attributes), not as a re-interpretation: replaying that message restores
the object with every attribute the kernel reported (metrics, multipath weights, protocol, scope,
labels), which is what "the host is identical after DEL" needs.
"""

from __future__ import annotations

import errno
import importlib.util
import sys
from typing import Any

from rdma_cni.net import rtcodec

Record = dict[str, Any]

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400

RTM_NEWADDR, RTM_DELADDR = 20, 21
RTM_NEWROUTE, RTM_DELROUTE = 24, 25
RTM_NEWRULE, RTM_DELRULE = 32, 33

_HEADERS = rtcodec.HEADER_FIELDS  # the header fields a record keeps, per kind
_DROP = {"IFA_CACHEINFO", "RTA_CACHEINFO", "RTA_EXPIRES"}


def plain(value: Any) -> Any:
    """pyroute2 message objects -> lists/dicts/str/int (what json can store)."""
    if type(value).__name__ == "nla_slot":
        return [value[0], plain(value[1])]
    if isinstance(value, list | tuple):
        return [plain(x) for x in value]
    if hasattr(value, "keys"):
        return {k: plain(value[k]) for k in value.keys() if k != "header"}
    return value


def record(kind: str, full: Record) -> Record:
    """What state keeps of a decoded message (:func:`decode`): every attribute but the timestamps
    (``_DROP``), which never replay."""
    out: Record = {k: full[k] for k in _HEADERS[kind]}
    out["attrs"] = [a for a in full["attrs"] if a[0] not in _DROP]
    return out


def decode(kind: str, data: bytes) -> Record:
    """A whole message (header included) -> a record with every attribute: by :mod:`rtcodec`, or by
    pyroute2's message class for what it does not handle (the two agree: tests/net/test_rtcodec.py)."""
    try:
        return rtcodec.decode(kind, data)
    except rtcodec.Unsupported:
        return pyroute2_decode(kind, data)


def encode(kind: str, rec: Record, msg_type: int, flags: int, seq: int) -> bytes:
    """A record -> the request (header included) to send, by :mod:`rtcodec` or pyroute2."""
    try:
        return rtcodec.encode(kind, rec, msg_type, flags, seq)
    except rtcodec.Unsupported:
        return pyroute2_encode(kind, rec, msg_type, flags, seq)


def pyroute2_decode(kind: str, data: bytes) -> Record:
    """:func:`decode` by pyroute2's message class alone: the fallback, and the reference the
    codec is held to (tests/net/test_rtcodec.py, scripts/bench-rtcodec)."""
    msg = _message_class(kind)(data)
    msg.decode()
    out: Record = {k: msg[k] for k in _HEADERS[kind]}
    out["attrs"] = [[s[0], plain(s[1])] for s in msg["attrs"]]
    return out


def pyroute2_encode(kind: str, rec: Record, msg_type: int, flags: int, seq: int) -> bytes:
    """:func:`encode` by pyroute2's message class alone (the fallback and the reference)."""
    msg = _message(kind, rec)
    msg["header"] = {"type": msg_type, "flags": flags, "sequence_number": seq, "pid": 0}
    msg.encode()
    return bytes(msg.data)


def attr(rec: Record, name: str, default: Any = None) -> Any:
    for key, value in rec.get("attrs", ()):
        if key == name:
            return value
    return default


def light_pyroute2() -> None:
    """Let ``pyroute2.<submodule>`` imports skip ``pyroute2/__init__``.

    That ``__init__`` imports every subsystem (conntrack, ndb, ipdb, ethtool, nftables...): ~60 ms of
    CPU of a cold plugin start that only needs rtnetlink. The package is registered as an empty
    module over the real package dir, so submodules import as usual; touching any other attribute
    of it (``pyroute2.IPRoute``) runs the real ``__init__`` then, so nothing else breaks. A no-op when
    pyroute2 is already imported (the warm agent imports it fully).
    """
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # the normal import will fail loudly on its own
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def missing(name: str) -> Any:  # PEP 562: called only for names the module does not have
        if not name.startswith("__") and importlib.util.find_spec(f"pyroute2.{name}") is not None:
            return importlib.import_module(f"pyroute2.{name}")  # ``from pyroute2 import config``
        del module.__getattr__
        loader.exec_module(module)
        return getattr(module, name)

    module.__getattr__ = missing  # type: ignore[method-assign]
    sys.modules["pyroute2"] = module


def _message_class(kind: str) -> Any:
    light_pyroute2()
    if kind == "addr":
        from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg as cls
    elif kind == "route":
        from pyroute2.netlink.rtnl.rtmsg import rtmsg as cls
    else:
        from pyroute2.netlink.rtnl.fibmsg import fibmsg as cls
    return cls


def _message(kind: str, rec: Record) -> Any:
    msg = _message_class(kind)()
    for key in _HEADERS[kind]:
        if key in rec:
            msg[key] = rec[key]
    msg["attrs"] = [list(a) for a in rec.get("attrs", ())]
    return msg


def send(ipr: Any, kind: str, rec: Record, msg_type: int, flags: int = 0) -> None:
    """One request with ACK on an :class:`~rdma_cni.net.nlsock.RtnlSocket`; a refusal raises its
    NetlinkError (``.code`` = errno)."""
    ipr.send_encoded(lambda seq: encode(kind, rec, msg_type, NLM_F_REQUEST | NLM_F_ACK | flags, seq))


def create(ipr: Any, kind: str, rec: Record) -> bool:
    """Add the object; False when it already exists (restoring twice is not an error)."""
    msg_type = {"addr": RTM_NEWADDR, "route": RTM_NEWROUTE, "rule": RTM_NEWRULE}[kind]
    try:
        send(ipr, kind, rec, msg_type, NLM_F_CREATE | NLM_F_EXCL)
    except Exception as exc:
        if error_code(exc) == errno.EEXIST:
            return False
        raise
    return True


def delete(ipr: Any, kind: str, rec: Record) -> bool:
    """Delete the object; False when it was already gone."""
    msg_type = {"addr": RTM_DELADDR, "route": RTM_DELROUTE, "rule": RTM_DELRULE}[kind]
    try:
        send(ipr, kind, rec, msg_type)
    except Exception as exc:
        if error_code(exc) in (errno.ESRCH, errno.ENOENT, errno.EADDRNOTAVAIL, errno.ENODEV):
            return False
        raise
    return True


def error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    if isinstance(exc, OSError):
        return exc.errno
    return None
