"""A probe plugin the agent tests serve (``--plugin probe=test_agent_probe:SPEC``), and wire tests.

The probe does nothing to the network: it reports where and how it ran (pid, net and mount
namespace inodes, an environment variable, the whole environment, cwd, scheduling policy) into the
file named by its
config's ``probeFile``, writes a line on stderr, and can sleep during ADD/DEL (``sleep`` seconds,
after writing ``startedFile``) so a test can kill the process running it mid-call. ``leakFd`` and
``leaveThread`` (seconds) make it leave a descriptor or a running thread behind. ``childSleep``
(seconds) runs ``sleep`` as a child process and waits for it, as a plugin waits for a delegate.

Tests that need calls to overlap wait on events, not on sleeps long enough for a loaded machine:
``barrier`` (a directory) with ``barrierCount`` N holds each call until N calls have arrived there,
so N calls are certainly running at once; ``holdFile`` holds the call until that file exists (the
test creates it once it has seen what it needed while the call ran); ``childHoldFile`` runs a child
process that waits for that file, as a plugin waits for a delegate that is still working.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from rdma_cni.agent import wire
from rdma_cni.cni.errors import CniError
from rdma_cni.cni.plugin import PluginSpec
from rdma_cni.cni.request import Request
from rdma_cni.cni.result import Interface, IPConfig, Result

PROBE_ERROR_CODE = 142


def where_am_i() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "net": os.stat("/proc/self/ns/net").st_ino,
        "mnt": os.stat("/proc/self/ns/mnt").st_ino,
        "env": os.environ.get("H7_PROBE", ""),
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "policy": os.sched_getscheduler(0),
    }


LEFT_BEHIND: list[object] = []  # what a probe told to leak something keeps alive
HOLD_LIMIT = 120.0  # a hold the test never releases ends here: the test then fails on what it asserts
CHILD_HOLD = (
    'end=$(($(date +%s) + $2)); while [ ! -e "$1" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.02; done'
)


def _hold(released: Callable[[], bool]) -> None:
    """Block until ``released()``: the event the test waits for, polled (a call holds a worker, so
    the poll's cost is the test's alone)."""
    deadline = time.monotonic() + HOLD_LIMIT
    while not released() and time.monotonic() < deadline:
        time.sleep(0.01)


def _meet(directory: str, count: int) -> None:
    """Arrive at the barrier in ``directory`` and wait for ``count`` calls to have arrived."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{os.getpid()}-{uuid.uuid4().hex[:8]}"), "w"):
        pass
    _hold(lambda: len(os.listdir(directory)) >= count)


class Probe:
    def _report(self, req: Request) -> None:
        sys.stderr.write(f"probe {req.command} on stderr\n")
        if req.config.get("leakFd"):
            LEFT_BEHIND.append(open(os.devnull))  # left open on purpose
        if req.config.get("leaveThread"):
            seconds = float(req.config["leaveThread"])
            thread = threading.Thread(target=time.sleep, args=(seconds,), daemon=True)
            thread.start()
            LEFT_BEHIND.append(thread)
        started = req.config.get("startedFile")
        if started:
            with open(started, "w") as f:
                json.dump(where_am_i(), f)
        if req.config.get("barrier"):
            _meet(str(req.config["barrier"]), int(req.config.get("barrierCount", 1)))
        if req.config.get("holdFile"):
            hold = str(req.config["holdFile"])
            _hold(lambda: os.path.exists(hold))
        time.sleep(float(req.config.get("sleep", 0)))
        if req.config.get("childSleep") or req.config.get("childHoldFile"):
            import subprocess

            if req.config.get("childHoldFile"):
                argv = ["sh", "-c", CHILD_HOLD, "sh", str(req.config["childHoldFile"]), str(int(HOLD_LIMIT))]
            else:
                argv = ["sleep", str(float(req.config["childSleep"]))]
            subprocess.run(argv, check=True)
        out = req.config.get("probeFile")
        if out:
            with open(out, "w") as f:
                json.dump(where_am_i(), f)
        if req.config.get("fail"):
            raise CniError(PROBE_ERROR_CODE, "probe was told to fail", "details here")

    def add(self, req: Request) -> Result:
        self._report(req)
        return Result(
            interfaces=[Interface(name=req.ifname, mac="02:00:00:00:00:01", sandbox=req.netns)],
            ips=[IPConfig(address="198.51.100.9/28", interface=0)],
        )

    def delete(self, req: Request) -> None:
        self._report(req)

    def check(self, req: Request) -> None:
        self._report(req)

    def gc(self, req: Request) -> None:
        self._report(req)

    def status(self, req: Request) -> None:
        self._report(req)


SPEC = PluginSpec(name="probe", factory=Probe, about="probe: reports where it ran")


def test_request_frame_round_trips_env_and_binary_stdin() -> None:
    env = {"CNI_COMMAND": "ADD", "CNI_ARGS": "A=b=c;X=", "EMPTY": "", "UTF": "é"}
    stdin = bytes(range(256))
    frame = wire.encode_request("rdma-macvlan", env, stdin)
    count = int.from_bytes(frame[4:8], "big")
    items = wire.decode_items(frame[12:], count)
    assert wire.decode_request(items) == ("rdma-macvlan", env, stdin)


def test_answer_frame_round_trips() -> None:
    frame = wire.encode_answer(7, '{"code":7}', "log line\n")
    items = wire.decode_items(frame[12:], int.from_bytes(frame[4:8], "big"))
    assert wire.decode_answer(items) == (7, '{"code":7}', "log line\n")


@pytest.mark.parametrize(
    "body,count",
    [
        (b"\x00\x00\x00\x05abc", 1),  # item longer than the frame
        (b"\x00\x00", 1),  # truncated length
        (b"\x00\x00\x00\x01ab", 1),  # trailing bytes
    ],
)
def test_malformed_frames_are_wire_errors(body: bytes, count: int) -> None:
    with pytest.raises(wire.WireError):
        wire.decode_items(body, count)


def test_answer_with_non_numeric_code_is_a_wire_error() -> None:
    with pytest.raises(wire.WireError):
        wire.decode_answer([b"x", b"", b""])
