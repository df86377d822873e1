"""Link and address change notifications of the calling thread's netns (rtnetlink multicast).

A reader that only needs to know *that* something changed (then re-reads the whole truth) does not
decode the messages: :meth:`LinkEvents.drain` just empties the queue. An overflow (ENOBUFS: the kernel
dropped messages while we were busy) counts as a change too, since something did change.

Usage::

    with LinkEvents() as events:
        if events.wait(0.5):      # True: links or addresses changed (or messages were lost)
            rescan()
"""

from __future__ import annotations

import errno
import select
import socket

RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100
_RCVBUF = 1 << 20  # a burst of pod starts moves many addresses at once


class LinkEvents:
    """A NETLINK_ROUTE socket bound to RTMGRP_LINK | IPV4_IFADDR | IPV6_IFADDR, non-blocking."""

    def __init__(self, groups: int = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                             socket.NETLINK_ROUTE)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
            sock.bind((0, groups))
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> LinkEvents:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def drain(self) -> int:
        """Read every queued message; how many were read (an overflow counts as one)."""
        count = 0
        while True:
            try:
                if not self._sock.recv(65536):
                    return count
            except BlockingIOError:
                return count
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
            count += 1

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s for a notification; True (queue drained) when one came."""
        ready, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
        return bool(ready) and self.drain() > 0
