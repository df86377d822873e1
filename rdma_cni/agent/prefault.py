"""Take an idle worker's copy-on-write faults before it has a call, not during the call.

A forked worker shares every page with the agent until it writes one; a CNI call then writes ~1,900
of them (mostly Python reference counts spread over the whole heap), and each first write is a page
fault that copies 4 KiB: 5-9 ms of system time on the call path. ``madvise(MADV_POPULATE_WRITE)``
(Linux 5.14) breaks the sharing of a whole mapping in the kernel while the worker waits in accept():
it writes no byte (nothing can race a Python allocation), has no effect outside this process and
costs only memory — the worker's private copy of the pages, given back when the worker exits — and
CPU. Copying every shared page (~7,000: ~30 MiB and ~15 ms per worker) copied ~4x what calls write;
:class:`HotPages` learns which pages those are from the workers, and the agent's warm workers copy
only them (~7 MiB). It goes chunk by chunk and stops the moment a call is waiting, so a call never
waits for it. Older kernels refuse the advice and the worker simply faults as before.
"""

from __future__ import annotations

import array
import ctypes
import os
import re
import select
import socket
from collections.abc import Callable, Iterable
from typing import cast

from rdma_cni.net.netns import libc

MADV_POPULATE_WRITE = 23
CHUNK = 64  # pages per advice (~0.1 ms of copying): how late a waiting call is noticed at most
# Kernel-provided mappings: not ordinary memory, nothing to copy.
_SPECIAL = ("[vvar]", "[vdso]", "[vsyscall]", "[vvar_vclock]")

_madvise: Callable[[int, int, int], int] | None = None


def _libc_madvise() -> Callable[[int, int, int], int]:
    global _madvise
    if _madvise is None:
        fn = libc().madvise
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        fn.restype = ctypes.c_int
        _madvise = cast(Callable[[int, int, int], int], fn)
    return _madvise


def writable_private_mappings(maps: str) -> list[tuple[int, int]]:
    """(start, end) of each private writable mapping in a /proc/<pid>/maps text: the ones a fork
    shares copy-on-write."""
    spans = []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[1][1] != "w" or fields[1][3] != "p":
            continue
        if len(fields) > 5 and fields[5] in _SPECIAL:
            continue
        start, _, end = fields[0].partition("-")
        spans.append((int(start, 16), int(end, 16)))
    return spans


Runs = list[tuple[int, int]]  # [start, end) address ranges, page aligned

# The top byte of a pagemap entry (little endian: every 8th byte) holds bit 63 (present, 0x80) and
# bit 56 (exclusively mapped, 0x01): mapped to b"1"/b"0" in C, runs found by a regex, not a loop.
_SHARED = bytes(b"1"[0] if byte & 0x81 == 0x80 else b"0"[0] for byte in range(256))
_OWN = bytes(b"1"[0] if byte & 0x81 == 0x81 else b"0"[0] for byte in range(256))
_ONES = re.compile(b"1+")


def _runs(pagemap: int, start: int, end: int, page: int, table: bytes) -> Runs:
    raw = os.pread(pagemap, (end - start) // page * 8, start // page * 8)
    flags = raw[7::8].translate(table)
    return [(start + m.start() * page, start + m.end() * page) for m in _ONES.finditer(flags)]


def shared_runs(pagemap: int, start: int, end: int, page: int) -> Runs:
    """(start, end) runs of pages in [start, end) that are present and still shared with another
    process (pagemap bit 63 set, bit 56 clear): the ones whose first write would copy. Pages never
    touched are left alone, so the advice allocates nothing the agent did not already have."""
    return _runs(pagemap, start, end, page, _SHARED)


def own_pages() -> Runs:
    """Runs of pages of the private writable mappings that this process holds on its own (present
    and exclusively mapped). In a worker that was forked from the agent and prefaulted at most the
    hot pages, these are the hot pages and what its calls wrote since: the pages worth copying
    ahead in the next worker (:class:`HotPages`). A few are pages the agent wrote after the fork
    (its own copy, so the worker's became exclusive): harmless, a handful."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/self/maps") as f:
            spans = writable_private_mappings(f.read())
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        out: Runs = []
        for start, end in spans:
            try:
                out += _runs(pagemap, start, end, page, _OWN)
            except OSError:
                continue
        return out
    finally:
        os.close(pagemap)


def merge(runs: Iterable[tuple[int, int]]) -> Runs:
    """Sorted, overlapping and touching runs joined."""
    out: Runs = []
    for start, end in sorted(runs):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(end, out[-1][1]))
        else:
            out.append((start, end))
    return out


def encode(runs: Runs) -> bytes:
    return array.array("Q", [x for run in runs for x in run]).tobytes()


def decode(data: bytes) -> Runs:
    flat = array.array("Q")
    flat.frombytes(data[: len(data) // 16 * 16])
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2) if flat[i] < flat[i + 1]]


class HotPages:
    """The pages the agent's calls write, learned from its workers: each worker, after its first
    call, reports the pages it holds on its own (:func:`own_pages`) as one datagram; the agent
    merges them, and every worker forked later prefaults only those. A full prefault copied every
    shared page (~30 MiB per idle worker); the pages calls write are ~1/4 of that, so an idle
    worker holds ~4x less memory and copies in ~1/4 of the time. Until the first report nothing is
    known and a worker is not prefaulted (the agent's first call pays its own faults)."""

    def __init__(self) -> None:
        self.runs: Runs = []
        self.reader, self.writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for sock in (self.reader, self.writer):
            sock.setblocking(False)
            sock.set_inheritable(False)

    def report(self) -> None:
        """In a worker: send the pages it holds on its own (dropped when the agent is behind)."""
        try:
            self.writer.send(encode(merge(own_pages())))
        except OSError:
            pass

    def receive(self) -> int:
        """In the agent: merge every waiting report; returns how many were read."""
        got: Runs = []
        reports = 0
        while True:
            try:
                data = self.reader.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                break
            reports += 1
            got += decode(data)
        if got:
            self.runs = merge(self.runs + got)
        return reports

    def size(self) -> int:
        return sum(end - start for start, end in self.runs)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


def populate(stop: Callable[[], bool] = lambda: False, only: Runs | None = None) -> tuple[int, int]:
    """Break the copy-on-write sharing of every shared page of the private writable mappings now
    (``only``: of those runs, e.g. the hot pages), one run of pages at a time, giving up as soon as
    ``stop()`` says a call is waiting (a call must never wait for this: it is only worth doing
    while there is nothing else to do).

    Returns (bytes populated, runs the kernel refused). Never raises: a refusal only means the call
    will take those faults itself, exactly as without this.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    done = refused = 0
    try:
        if only is None:
            with open("/proc/self/maps") as f:
                spans = writable_private_mappings(f.read())
        else:
            spans = only
        madvise = _libc_madvise()
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, AttributeError):
        return 0, 0
    try:
        for span_start, span_end in spans:
            try:
                runs = shared_runs(pagemap, span_start, span_end, page)
            except OSError:
                continue
            for run_start, run_end in runs:
                for start in range(run_start, run_end, CHUNK * page):
                    if stop():
                        return done, refused
                    end = min(run_end, start + CHUNK * page)
                    if madvise(start, end - start, MADV_POPULATE_WRITE) == 0:
                        done += end - start
                    else:
                        refused += 1
    finally:
        os.close(pagemap)
    return done, refused


def warm() -> None:
    """Resolve madvise in the agent, so a worker neither loads nor looks it up."""
    try:
        _libc_madvise()
    except (OSError, AttributeError):
        pass


# --- when: only on a CPU nothing else wants --------------------------------------------------------


def populate_when_idle(
    listener: socket.socket, leaving: Callable[[], bool] = lambda: False, only: Runs | None = None
) -> None:
    """Prefault under SCHED_IDLE: the copying (~15 ms of CPU) then takes only CPU time no other
    task wants, so it never slows a call, the client waiting for it, or the node; and it goes on
    while a call runs in another worker when a CPU is free, so the next call finds this worker
    warm. Measured on 2 shared CPUs (load ~3), 80 cycles each, against pausing the copying while
    any call runs: CHECK 14.2 -> 11.3 ms, ADD 20.7 -> 19.2 ms, DEL and VERSION unchanged. It
    stops when a call waits or when the parent took it back to normal priority (wake_idle)."""

    def stop() -> bool:
        return readable(listener) or leaving() or os.sched_getscheduler(0) != os.SCHED_IDLE

    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    try:
        populate(stop=stop, only=only)
    finally:
        normal_priority(0)


def normal_priority(pid: int) -> None:
    """Back to SCHED_OTHER: a call never runs at idle priority."""
    try:
        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    except ProcessLookupError:
        pass  # an idle worker that just exited


def may_idle_and_return() -> bool:
    """Whether a worker may leave SCHED_IDLE again (root, or CAP_SYS_NICE): tried in a child, as
    a worker stuck at idle priority would serve its call only when the node has nothing else to do."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def readable(sock: socket.socket, timeout: float = 0.0) -> bool:
    """A connection waits in the backlog (or arrives within ``timeout`` seconds)."""
    return bool(select.select([sock], [], [], timeout)[0])
