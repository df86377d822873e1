"""prefault: an idle worker takes its copy-on-write faults ahead of a call, changing no byte.

Real forks and the real kernel advice: the child's page-fault counter and /proc/self/pagemap show
whether the sharing was broken; the data on both sides shows nothing was written.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path

import pytest
from test_agent import (
    client,
    cni_env,
    forward_in_thread,
    probe_conf,
    read_json,
    start_agent,
    stop,
    wait_for_children,
)

from rdma_cni.agent import prefault

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


# --- in the agent: prefault only between calls ---------------------------------------------------

PREFAULTED_KIB = 8 * 1024  # an unprefaulted idle worker holds ~1.6 MiB of its own, a prefaulted ~35


def _private_dirty_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    raise AssertionError(f"no Private_Dirty in /proc/{pid}/smaps_rollup")


def _wait_prefaulted(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _private_dirty_kib(pid) < PREFAULTED_KIB:
        assert time.monotonic() < deadline, f"worker {pid} never prefaulted"
        time.sleep(0.05)


def test_idle_worker_prefaults_only_while_no_call_runs(tmp_path: Path) -> None:
    """A worker forked while calls run (the last idle one was taken) waits with its copying until
    they are done: the copying would take the CPU those calls need."""
    running = start_agent(tmp_path)
    try:
        for pid in wait_for_children(running.pid, 2):
            _wait_prefaulted(pid)
        threads, busy = [], set()
        for n in range(2):  # both idle workers take a call; the agent forks a spare at once
            started = tmp_path / f"started{n}.json"
            slow = probe_conf(sleep=3, startedFile=str(started))
            thread, box = forward_in_thread(running.sock, cni_env("DEL"), slow)
            threads.append((thread, box))
            busy.add(int(str(read_json(started)["pid"])))
        (spare,) = wait_for_children(running.pid, 3) - busy
        deadline = time.monotonic() + 1.0  # the old prefault started 5 ms after the fork
        while time.monotonic() < deadline:
            assert _private_dirty_kib(spare) < PREFAULTED_KIB, "the spare prefaulted during the calls"
            time.sleep(0.02)
        for thread, box in threads:
            thread.join(30)
            assert isinstance(box[0], client.Answer) and box[0].code == 0
        _wait_prefaulted(spare)  # the calls are done: now it copies
    finally:
        stop(running.proc)
