"""prefault: an idle worker takes its copy-on-write faults ahead of a call, changing no byte.

Real forks and the real kernel advice: the child's page-fault counter and /proc/self/pagemap show
whether the sharing was broken; the data on both sides shows nothing was written.
"""

from __future__ import annotations

import mmap
import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from netns import stop_agent as stop
from probe_agent import cni_env, live_children, probe_conf, read_json, start_agent

from rdma_cni.agent import client, prefault

PAGE = os.sysconf("SC_PAGE_SIZE")
PAGES = 256  # 1 MiB at 4 KiB pages


def _minflt() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def _present(addr: int, pages: int) -> list[tuple[bool, bool]]:
    """(present, exclusive) of each page from this process's pagemap."""
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        raw = os.pread(fd, pages * 8, addr // PAGE * 8)
    finally:
        os.close(fd)
    return [(bool(e >> 63 & 1), bool(e >> 56 & 1)) for (e,) in struct.iter_unpack("Q", raw)]


def _in_child(body: object) -> bytes:
    """Run ``body()`` in a forked child; return what it wrote to the pipe (its verdict)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = body()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            out = f"error {exc!r}".encode()
        os.write(w, out)
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return data


def test_mappings_parsed_only_private_writable() -> None:
    maps = (
        "55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]\n"
        "7f0000000000-7f0000001000 r--p 00000000 08:01 12345                      /usr/lib/libc.so.6\n"
        "7f0000001000-7f0000003000 rw-p 00001000 08:01 12345                      /usr/lib/libc.so.6\n"
        "7f0000003000-7f0000004000 rw-s 00000000 00:01 99                         /dev/zero (deleted)\n"
        "7f0000004000-7f0000005000 ---p 00000000 00:00 0 \n"
        "7ffd00000000-7ffd00002000 rw-p 00000000 00:00 0                          [vvar]\n"
        "7ffd00010000-7ffd00031000 rw-p 00000000 00:00 0                          [stack]\n"
    )
    assert prefault.writable_private_mappings(maps) == [
        (0x55D0C0000000, 0x55D0C0021000),
        (0x7F0000001000, 0x7F0000003000),
        (0x7FFD00010000, 0x7FFD00031000),
    ]


def test_child_takes_its_copies_ahead_and_changes_no_byte() -> None:
    region = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pattern = bytes(range(256)) * (PAGES * PAGE // 256)
    region[:] = pattern  # present in the parent, so shared copy-on-write with the child
    addr = _address(region)

    def child() -> bytes:
        before = _present(addr, PAGES)
        done, refused = prefault.populate()
        after = _present(addr, PAGES)
        faults = _minflt()
        for i in range(PAGES):  # the call's writes: none may fault now
            region[i * PAGE] = region[i * PAGE]
        faults = _minflt() - faults
        same = region[:] == pattern
        return repr(
            (sum(e for _, e in before), sum(e for _, e in after), done, refused, faults, same)
        ).encode()

    exclusive_before, exclusive_after, done, refused, faults, same = eval(_in_child(child))
    if refused and not done:
        pytest.skip("the kernel refuses MADV_POPULATE_WRITE (Linux < 5.14)")
    assert exclusive_before == 0, "the pages should start shared with the parent"
    assert exclusive_after == PAGES
    assert done >= PAGES * PAGE
    assert faults < PAGES // 8, f"{faults} faults on pages that were prefaulted"
    assert same
    assert region[:] == pattern, "the parent's copy changed"
    region.close()


def test_untouched_pages_stay_unallocated() -> None:
    """Reserved but never written memory is not shared, so the advice must not allocate it."""
    region = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = _address(region)

    def child() -> bytes:
        prefault.populate()
        return repr(sum(p for p, _ in _present(addr, PAGES))).encode()

    assert int(_in_child(child)) == 0
    region.close()


def _address(region: mmap.mmap) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(region))


def test_stops_as_soon_as_a_call_waits() -> None:
    region = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region[:] = b"x" * (PAGES * PAGE)

    def child() -> bytes:
        asked: list[int] = []

        def stop() -> bool:
            asked.append(1)
            return len(asked) > 1  # a call arrives after the first chunk

        done, _ = prefault.populate(stop=stop)
        return repr((len(asked), done)).encode()

    asked, done = eval(_in_child(child))
    if done == 0:
        pytest.skip("the kernel refuses MADV_POPULATE_WRITE (Linux < 5.14)")
    assert asked == 2
    assert done <= prefault.CHUNK * PAGE, "one chunk at most, then the call"
    region.close()


def test_hot_pages_learned_from_one_child_are_the_only_ones_the_next_child_copies() -> None:
    """A worker reports the pages its call wrote (own_pages, one datagram); a worker forked later
    copies exactly those ahead (populate(only=...)) and leaves every other shared page shared."""
    region = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region[:] = b"y" * (PAGES * PAGE)  # present in the parent: shared with each child
    addr = _address(region)
    written = [3, 4, 5, 77, 200]
    hot = prefault.HotPages()

    def first_call() -> bytes:
        for i in written:
            region[i * PAGE] = ord("w")
        hot.report()
        return b"ok"

    assert _in_child(first_call) == b"ok"
    assert hot.receive() == 1
    inside = [(max(s, addr), min(e, addr + PAGES * PAGE)) for s, e in hot.runs if s < addr + PAGES * PAGE
              and e > addr]
    assert inside == [(addr + 3 * PAGE, addr + 6 * PAGE), (addr + 77 * PAGE, addr + 78 * PAGE),
                      (addr + 200 * PAGE, addr + 201 * PAGE)]
    assert hot.size() < 16 * 2**20, "a child that wrote 5 pages of ours reports only what it owns"

    def next_worker() -> bytes:
        done, _ = prefault.populate(only=hot.runs)
        own = [i for i, (present, mine) in enumerate(_present(addr, PAGES)) if present and mine]
        return repr((done, own)).encode()

    done, own = eval(_in_child(next_worker))
    if not done:
        pytest.skip("the kernel refuses MADV_POPULATE_WRITE (Linux < 5.14)")
    assert own == written
    assert region[:] == b"y" * (PAGES * PAGE), "the parent's copy changed"
    hot.close()
    region.close()


def test_hot_page_reports_encode_and_merge() -> None:
    runs = [(0x2000, 0x5000), (0x1000, 0x2000), (0x9000, 0xA000), (0x3000, 0x4000)]
    assert prefault.merge(runs) == [(0x1000, 0x5000), (0x9000, 0xA000)]
    assert prefault.decode(prefault.encode(prefault.merge(runs))) == [(0x1000, 0x5000), (0x9000, 0xA000)]
    assert prefault.decode(b"\0" * 7) == []


# --- in the agent: prefault only between calls ---------------------------------------------------

UNPREFAULTED_KIB = 2 * 1024  # what an idle worker that copied nothing ahead holds of its own (~1.6 MiB)


def _private_dirty_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Private_Dirty:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0  # a worker that just left (retired, replaced)
    raise AssertionError(f"no Private_Dirty in /proc/{pid}/smaps_rollup")


def _learned_hot_kib(log: Path, timeout: float = 30.0) -> int:
    """The size of the hot pages the agent reports having learned from its workers."""
    import re

    deadline = time.monotonic() + timeout
    while not (found := re.findall(r"calls write ([0-9.]+) MiB", log.read_text())):
        assert time.monotonic() < deadline, "the agent never learned which pages calls write"
        time.sleep(0.05)
    return int(float(found[-1]) * 1024)


def _copied(pid: int, kib: int) -> bool:
    try:
        return _private_dirty_kib(pid) >= kib and os.sched_getscheduler(pid) == os.SCHED_OTHER
    except ProcessLookupError:
        return False


def _wait_prefaulted(agent_pid: int, count: int, hot_kib: int, timeout: float = 30.0) -> set[int]:
    """Until ``count`` idle workers each hold (most of) the hot pages as their own and are back at
    normal priority: done copying."""
    assert hot_kib * 3 // 4 > UNPREFAULTED_KIB, "too few hot pages to tell a prefaulted worker"
    deadline = time.monotonic() + timeout
    while True:
        pids = live_children(agent_pid)
        if len(pids) == count and all(_copied(p, hot_kib * 3 // 4) for p in pids):
            return pids
        assert time.monotonic() < deadline, f"workers {pids} never prefaulted {hot_kib} KiB"
        time.sleep(0.05)


def test_prefault_runs_under_sched_idle_and_stops_when_taken_back_to_normal() -> None:
    """In a child with a listener nobody connects to: the copying runs at SCHED_IDLE, stops as
    soon as something (the parent's wake_idle) sets the worker back to SCHED_OTHER, and the worker
    leaves at SCHED_OTHER."""

    def child() -> bytes:
        seen: list[object] = []

        def fake_populate(stop: object, only: object = None) -> tuple[int, int]:
            seen.append(os.sched_getscheduler(0) == os.SCHED_IDLE)
            seen.append(stop())  # type: ignore[operator]
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # what wake_idle does
            seen.append(stop())  # type: ignore[operator]
            return 0, 0

        prefault.populate = fake_populate  # type: ignore[assignment]  # this child only
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind("\0h8-prefault-" + str(os.getpid()))
            listener.listen(1)
            prefault.populate_when_idle(listener)
        seen.append(os.sched_getscheduler(0) == os.SCHED_OTHER)
        return repr(seen).encode()

    assert eval(_in_child(child)) == [True, False, True, True]


def test_a_call_waiting_in_the_backlog_takes_idle_workers_off_sched_idle(tmp_path: Path) -> None:
    """Idle workers hold their private copies. When a call waits because no idle worker accepts
    it (here: stopped; on a saturated node: copying under SCHED_IDLE and given no CPU), the parent
    takes every idle worker back to normal priority; the call then runs at normal priority."""
    running = start_agent(tmp_path)
    idle: set[int] = set()
    try:
        # A first call teaches the agent which pages calls write; idle workers then prefault those.
        first = client.forward("probe", cni_env("VERSION"), probe_conf(), 60, running.sock)
        assert isinstance(first, client.Answer) and first.code == 0
        idle = _wait_prefaulted(running.pid, 2, _learned_hot_kib(running.log))
        for pid in idle:
            os.kill(pid, signal.SIGSTOP)
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))  # as if still copying
        marker = tmp_path / "where.json"
        box: list[object] = []
        thread = threading.Thread(
            target=lambda: box.append(
                client.forward("probe", cni_env("DEL"), probe_conf(probeFile=str(marker)), 60, running.sock)
            )
        )
        thread.start()
        deadline = time.monotonic() + 20
        while any(os.sched_getscheduler(pid) != os.SCHED_OTHER for pid in idle):
            assert time.monotonic() < deadline, "idle workers stayed at SCHED_IDLE with a call waiting"
            time.sleep(0.02)
        for pid in idle:
            os.kill(pid, signal.SIGCONT)  # both still exist: neither could take the call while stopped
        thread.join(60)
        assert isinstance(box[0], client.Answer) and box[0].code == 0
        assert read_json(marker)["policy"] == os.SCHED_OTHER
    finally:
        for pid in idle:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # the worker that served the call has exited
        stop(running.proc)
