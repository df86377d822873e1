"""Take an idle worker's copy-on-write faults before it has a call, not during the call.

A forked worker shares every page with the agent until it writes one; a CNI call then writes ~1,900
of them (mostly Python reference counts spread over the whole heap), and each first write is a page
fault that copies 4 KiB: 5-9 ms of system time on the call path. ``madvise(MADV_POPULATE_WRITE)``
(Linux 5.14) breaks the sharing of a whole mapping in the kernel while the worker waits in accept():
it writes no byte (nothing can race a Python allocation), has no effect outside this process and
costs only memory — the worker's private copy of the agent's writable pages (~30 MiB), given back
when the worker exits — and ~15 ms of CPU per worker, since it copies every shared page (~7,000),
not only the ones a call writes. It goes chunk by chunk and stops the moment a call is waiting, so
a call never waits for it. Older kernels refuse the advice and the worker simply faults as before.
"""

from __future__ import annotations

import array
import ctypes
import os
from collections.abc import Callable
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


def shared_runs(pagemap: int, start: int, end: int, page: int) -> list[tuple[int, int]]:
    """(start, end) runs of pages in [start, end) that are present and still shared with another
    process (pagemap bit 63 set, bit 56 clear): the ones whose first write would copy. Pages never
    touched are left alone, so the advice allocates nothing the agent did not already have."""
    count = (end - start) // page
    raw = os.pread(pagemap, count * 8, start // page * 8)
    entries = array.array("Q", raw)
    runs: list[tuple[int, int]] = []
    run_start = -1
    for i, entry in enumerate(entries):
        shared = entry >> 63 & 1 and not entry >> 56 & 1
        if shared and run_start < 0:
            run_start = i
        elif not shared and run_start >= 0:
            runs.append((start + run_start * page, start + i * page))
            run_start = -1
    if run_start >= 0:
        runs.append((start + run_start * page, start + len(entries) * page))
    return runs


def populate(stop: Callable[[], bool] = lambda: False) -> tuple[int, int]:
    """Break the copy-on-write sharing of every shared page of the private writable mappings now,
    one run of pages at a time, giving up as soon as ``stop()`` says a call is waiting (a call must
    never wait for this: it is only worth doing while there is nothing else to do).

    Returns (bytes populated, runs the kernel refused). Never raises: a refusal only means the call
    will take those faults itself, exactly as without this.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    done = refused = 0
    try:
        with open("/proc/self/maps") as f:
            spans = writable_private_mappings(f.read())
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
