"""Wake-ups when entries of one directory come and go: kubelet's device-plugins directory, where a
restarting kubelet deletes every plugin's socket and re-creates its own ``kubelet.sock``.

inotify (through the ``inotify_simple`` package) reports a create, delete or rename in the directory
the moment it happens. Where inotify cannot be had (the package or the syscall missing, the per-user
instance or watch limit reached, the directory not there yet, ``RDMA_CNI_INOTIFY=off``) every wait
simply ends after ``fallback_s``, and the caller looks again: the poll it replaces. Either way the
caller re-reads the truth (``lstat``) after each wake-up; events are hints, never decoded into
state, so a lost one (queue overflow) costs nothing but a look. Another thread ends a wait with
:meth:`DirWatch.wake` (an eventfd), e.g. on a stop request or a closed stream.

Usage::

    with DirWatch("/var/lib/kubelet/device-plugins", fallback_s=0.1) as watch:
        while not done():
            check_sockets()
            watch.wait(1.0)      # True: an entry came or went, or wake() was called
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
from typing import Any

log = logging.getLogger(__name__)

ENV_SWITCH = "RDMA_CNI_INOTIFY"  # "off": poll (a filesystem whose inotify events do not arrive)

IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_IGNORED = 0x400, 0x800, 0x8000
MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
_WATCH_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED  # the directory itself went: watch it anew


def _open_inotify() -> tuple[Any, str]:
    """An inotify instance, or None and why not."""
    if os.environ.get(ENV_SWITCH, "").lower() in ("off", "0", "false", "no"):
        return None, f"{ENV_SWITCH}={os.environ[ENV_SWITCH]}"
    try:
        from inotify_simple import INotify
    except ImportError as e:
        return None, f"inotify_simple is not installed ({e})"
    try:
        return INotify(nonblocking=True), ""
    except OSError as e:  # EMFILE: fs.inotify.max_user_instances reached; ENOSYS: no inotify here
        return None, f"inotify_init1 failed: {e}"


class DirWatch:
    """One directory, watched for entries created, deleted or renamed (see the module doc)."""

    def __init__(self, directory: str, fallback_s: float, inotify: bool = True) -> None:
        self.directory = directory
        self.fallback_s = fallback_s
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._poller = select.poll()
        self._poller.register(self._wake_fd, select.POLLIN)
        self._inotify: Any
        self._inotify, self.why_polling = _open_inotify() if inotify else (None, "inotify not asked for")
        if self._inotify is not None:
            self._poller.register(self._inotify.fileno(), select.POLLIN)
        self._watching = False
        self._closed = False
        self._noted = ""
        self._ensure_watch()

    @property
    def watching(self) -> bool:
        """True while inotify watches the directory (waits last until a change); False: waits poll."""
        return self._watching

    def wait(self, timeout: float) -> bool:
        """Up to ``timeout`` s (at most ``fallback_s`` while not watching) for a change in the directory
        or a :meth:`wake`; True when one of those ended the wait, False when the time ran out. A watch
        put in place only now is True at once: what happened before it was there sent no event."""
        if self._ensure_watch():
            return True
        limit = timeout if self._watching else min(timeout, self.fallback_s)
        woke = False
        for fd, _ in self._poller.poll(math.ceil(max(limit, 0.0) * 1000)):
            if fd == self._wake_fd:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._wake_fd)
                woke = True
            elif self._drain():
                woke = True
        return woke

    def wake(self) -> None:
        """End the current (or the next) wait now; from any thread."""
        if not self._closed:
            with contextlib.suppress(OSError):  # closed meanwhile: nobody waits any more
                os.eventfd_write(self._wake_fd, 1)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._inotify is not None:
            self._inotify.close()
        os.close(self._wake_fd)

    def __enter__(self) -> DirWatch:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _ensure_watch(self) -> bool:
        """Watch the directory if it is not watched yet; True when the watch was put in place now."""
        if self._inotify is None:
            self._note("poll", "polling %s every %.0f ms: %s", self.directory, self.fallback_s * 1000,
                       self.why_polling)
            return False
        if self._watching:
            return False
        try:
            self._inotify.add_watch(self.directory, MASK)
        except OSError as e:  # ENOENT until the directory exists; ENOSPC: max_user_watches reached
            self.why_polling = f"cannot watch it: {e}"
            self._note("poll", "polling %s every %.0f ms: %s", self.directory, self.fallback_s * 1000,
                       self.why_polling)
            return False
        self._watching = True
        self._note("inotify", "watching %s with inotify", self.directory)
        return True

    def _drain(self) -> bool:
        """Read every queued event; True when there was any. The directory's own removal or
        renaming ends the watch (the kernel sends IN_IGNORED): the next wait adds it again."""
        events = list(self._inotify.read(timeout=0))
        if any(ev.mask & _WATCH_GONE for ev in events):
            self._watching = False
        return bool(events)

    def _note(self, state: str, msg: str, *args: object) -> None:
        """Log once per change between watching and polling, not once per wait."""
        if state != self._noted:
            self._noted = state
            log.log(logging.INFO if state == "inotify" else logging.WARNING, msg, *args)
