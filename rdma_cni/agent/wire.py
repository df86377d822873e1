"""The agent's wire format: length-prefixed frames simple enough for a C client of a few lines.

Kept stdlib-only and tiny because the thin CNI client imports it on every pod start. All integers
are unsigned 32-bit big-endian. See :mod:`rdma_cni.agent.client` for the conversation.

Versions (docs/compatibility-policy.md): a client offers the wire versions it speaks as one more
request item, ``RDMA_CNI_WIRE=<lo>-<hi>``, shaped like an environment variable so that an agent
from before the offer (version 1, which never sends it) passes it to the plugin as one and serves
the call; an agent that knows it takes it out of the environment. No offer means version 1. The
agent serves the highest version both speak; with none in common it answers :data:`SKEW` and a
frame naming both ranges to a client that offered 2 or later (which prints it and runs the call
in-process), and a plain :data:`REFUSE` to a version-1 client (which falls back silently). So
during a rolling update an old client on disk and a new agent, or the reverse, still serve every
call through the agent while their ranges overlap, and fall back to the in-process plugin,
naming both versions, once they do not.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping, Sequence

MAGIC = b"RCN1"
READY = b"R"  # the worker has the request and the caller's namespaces; it runs it once told GO
REFUSE = b"N"  # the agent will not run it (busy, not allowed, cannot enter the namespaces): fall back
GO = b"G"  # the client commits: from now on the request runs in the agent, and only there
SKEW = b"V"  # refused: no wire version in common; a frame with the reason follows (offers of 2+ only)
MAX_FRAME = 8 * 1024 * 1024  # stdin is capped at 4 MiB by the protocol core; env adds little
_U32 = struct.Struct("!I")

VERSION = 2  # the newest wire version this code speaks (1: the conversation before the offer)
OLDEST = 1  # the oldest it still speaks: the previous version's thin client or agent
OFFER_ENV = "RDMA_CNI_WIRE"  # the request item that carries a client's offer, "<lo>-<hi>"
Range = tuple[int, int]


class WireError(Exception):
    """The peer sent something that is not a frame, or hung up in the middle of one."""


def offer(spoken: Range = (OLDEST, VERSION)) -> str:
    """The value of the :data:`OFFER_ENV` item of a client that speaks ``spoken``."""
    return f"{spoken[0]}-{spoken[1]}"


def parse_offer(text: str | None) -> Range:
    """A client's offer; no offer is a version-1 client. WireError when it is not ``<lo>-<hi>``."""
    if text is None:
        return (1, 1)
    lo, sep, hi = text.partition("-")
    if not (sep and lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        raise WireError(f"{OFFER_ENV}={text[:40]!r} is not a wire version range <lo>-<hi>")
    return (int(lo), int(hi))


def agree(offered: Range, spoken: Range = (OLDEST, VERSION)) -> int | None:
    """The highest version in both ranges, or None when they do not overlap."""
    best = min(offered[1], spoken[1])
    return best if best >= max(offered[0], spoken[0]) else None


def skew_reason(offered: Range, spoken: Range = (OLDEST, VERSION)) -> str:
    """Why a call was refused for its wire version, naming both sides' ranges and the way out."""
    newer = "rdma-agent" if spoken[0] > offered[1] else "the thin client"
    return (
        f"the thin client speaks wire versions {offer(offered)} and rdma-agent {offer(spoken)}: no "
        f"version in common ({newer} is the newer one); finish the rolling update, which installs the "
        "client and the agent of one release together"
    )


def encode_items(items: Sequence[bytes]) -> bytes:
    body = b"".join(_U32.pack(len(item)) + item for item in items)
    return MAGIC + _U32.pack(len(items)) + _U32.pack(len(body)) + body


def decode_items(body: bytes, count: int) -> list[bytes]:
    items: list[bytes] = []
    pos = 0
    for _ in range(count):
        if pos + 4 > len(body):
            raise WireError("frame ends inside an item length")
        (size,) = _U32.unpack_from(body, pos)
        pos += 4
        if pos + size > len(body):
            raise WireError("frame ends inside an item")
        items.append(body[pos : pos + size])
        pos += size
    if pos != len(body):
        raise WireError("frame has bytes after its last item")
    return items


def encode_request(plugin: str, env: Mapping[str, str], stdin: bytes) -> bytes:
    """Items: plugin name, stdin, then one ``KEY=VALUE`` per environment variable."""
    pairs = [f"{k}={v}".encode("utf-8", "surrogateescape") for k, v in env.items()]
    return encode_items([plugin.encode(), stdin, *pairs])


def decode_request(items: Sequence[bytes]) -> tuple[str, dict[str, str], bytes]:
    if len(items) < 2:
        raise WireError("request frame needs at least the plugin name and stdin")
    env: dict[str, str] = {}
    for raw in items[2:]:
        key, sep, value = raw.decode("utf-8", "surrogateescape").partition("=")
        if not sep or not key:
            raise WireError(f"environment entry without '=': {raw[:40]!r}")
        env[key] = value
    return items[0].decode("utf-8", "replace"), env, bytes(items[1])


def encode_answer(code: int, stdout: str, stderr: str) -> bytes:
    """Items: exit code as decimal text, stdout, stderr."""
    return encode_items([str(code).encode(), stdout.encode(), stderr.encode("utf-8", "replace")])


def decode_answer(items: Sequence[bytes]) -> tuple[int, str, str]:
    if len(items) != 3:
        raise WireError(f"answer frame has {len(items)} items, expected 3")
    try:
        code = int(items[0])
    except ValueError as exc:
        raise WireError(f"answer exit code {items[0][:20]!r} is not a number") from exc
    return code, items[1].decode("utf-8", "replace"), items[2].decode("utf-8", "replace")


def recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise WireError(f"peer hung up with {left} of {size} bytes unread")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, head: bytes = b"") -> list[bytes]:
    """Read one frame; ``head`` is any part of its 12-byte header already read (with fds, say)."""
    header = head + recv_exact(sock, 12 - len(head))
    if header[:4] != MAGIC:
        raise WireError(f"bad magic {header[:4]!r}: not an rdma-agent frame")
    (count,) = _U32.unpack_from(header, 4)
    (size,) = _U32.unpack_from(header, 8)
    if size > MAX_FRAME or count > size // 4 + 1:
        raise WireError(f"frame of {size} bytes / {count} items is over the limit")
    return decode_items(recv_exact(sock, size), count)
