"""The thin CNI client: hand ``(env, stdin)`` to the warm ``rdma-agent`` and print its answer.

Imports nothing but the standard library (no pyroute2, pydantic or click), because it runs first on
every CNI call; when the agent is absent, slow or broken, the caller runs the plugin in-process and
gets the same answer. An entry point uses it like this, before importing anything heavy::

    code = try_agent("rdma-macvlan")
    if code is not None:
        sys.exit(code)

Protocol (wire version 2; a C client implements the same in ``client.c``). Integers are u32 big-endian;
a *frame* is ``"RCN1" count size`` followed by ``count`` items of ``len bytes`` (``size`` bytes).

1. Connect to the unix stream socket ``$RDMA_CNI_AGENT_SOCKET`` (default
   ``/run/rdma-cni/agent.sock``; mode 0600, owned by root; the agent also checks the peer is uid 0).
2. Send the request frame — items: plugin name (``rdma-macvlan``), stdin, then every environment
   variable as ``KEY=VALUE`` — in one ``sendmsg`` carrying three descriptors by SCM_RIGHTS:
   ``/proc/self/ns/net``, ``/proc/self/ns/mnt`` and ``/`` (a directory descriptor) of the client.
   One more ``KEY=VALUE`` item, ``RDMA_CNI_WIRE=1-2``, offers the wire versions the client speaks
   (:mod:`rdma_cni.agent.wire`); the agent takes it out of the plugin's environment.
   The agent runs the request in a forked worker that enters those namespaces, takes that root
   (``fchdir`` + ``chroot``: joining a mount namespace puts a process at the namespace's root, and
   upstream Multus thick runs its delegates chrooted into ``/hostroot`` of its container's mount
   namespace) and takes that environment, so it sees the same ``CNI_NETNS`` path, ``/sys`` and
   files as the client would: the plugin code cannot tell the difference. The agent also accepts
   the two namespace descriptors alone (a client from before the root was passed) and runs such a
   request at the mount namespace's root.
3. The worker answers one byte: ``R`` (ready) or ``N`` (refused: busy, peer not root, namespaces not
   enterable; also any hang-up), or ``V`` and a frame of one item, the reason (refused: no wire
   version in common; the client writes the reason, which names both versions, to stderr). Before
   ``R`` nothing has run, so the client may fall back to running in-process; it waits for ``R`` at
   most ``timeout`` seconds.
4. The client sends one byte ``G`` (go). The worker runs the request only after reading ``G``, so a
   client that gave up before sending it can never race a worker running the same request. For
   verbs that are safe to run twice (DEL, CHECK, GC, STATUS, VERSION) the client sends ``G`` right
   behind the request without waiting for ``R`` (one round trip less); only ADD waits.
5. The worker sends the answer frame — items: exit code (decimal text), stdout, stderr — and closes.
   If the connection breaks after ``G`` (worker killed), the request may have partly run: DEL, CHECK,
   GC, STATUS and VERSION are safe to repeat, so the client falls back and runs them in-process. An
   ADD is run again in-process only when the agent itself is gone too (the process that listens on
   the socket, known by ``SO_PEERCRED``): in a DaemonSet the agent is its container's first process,
   so its death takes every worker with it, and nothing can still be running the call; the plugin's
   ADD then undoes what the dead worker recorded and does it again, as it does for a runtime's
   retry. Without this, the pod waited for kubelet's retry of the sandbox: on the test cluster a
   kill -9 of rdma-agent 0.06 s into an ADD under upstream Multus left the pod Running 17 s later
   (kubelet's pod-worker back-off is 10 s with jitter), not ~1 s. A worker that died while its
   agent lives (its own crash, an OOM kill) is answered with error 11 (try again later), as is an
   answer that does not come within ``ANSWER_TIMEOUT`` — the runtime then calls DEL, which restores
   the host from the state the ADD wrote ahead.
"""

from __future__ import annotations

import io
import os
import socket
import struct
import sys
import time
from collections.abc import Mapping
from typing import NamedTuple

from rdma_cni.agent import wire

DEFAULT_SOCKET = "/run/rdma-cni/agent.sock"
SOCKET_ENV = "RDMA_CNI_AGENT_SOCKET"
DISABLE_ENV = "RDMA_CNI_AGENT"  # "off": never use the agent (what a fallback exec sets, too)
TIMEOUT_ENV = "RDMA_CNI_AGENT_TIMEOUT"
READY_TIMEOUT = 3.0  # seconds to connect and get READY; past it the in-process run is the faster one
ANSWER_TIMEOUT = 600.0  # a committed request ends by itself; this only stops a wedged worker
REPEATABLE = frozenset({"DEL", "CHECK", "GC", "STATUS", "VERSION"})
TRY_AGAIN_LATER = 11  # rdma_cni.cni.errors.TRY_AGAIN_LATER, not imported to keep this module light


class Answer(NamedTuple):
    stdout: str
    code: int
    stderr: str = ""


def socket_path(env: Mapping[str, str]) -> str:
    return env.get(SOCKET_ENV) or DEFAULT_SOCKET


def forward(
    plugin_name: str,
    env: Mapping[str, str],
    stdin: bytes,
    timeout: float = READY_TIMEOUT,
    path: str | None = None,
) -> Answer | None:
    """Run one CNI call in the agent; None means "not run there: run it in-process"."""
    path = path or socket_path(env)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        return _converse(sock, path, plugin_name, env, stdin, timeout)
    finally:
        sock.close()


def _converse(
    sock: socket.socket, path: str, plugin: str, env: Mapping[str, str], stdin: bytes, timeout: float
) -> Answer | None:
    sock.settimeout(timeout)
    eager = env.get("CNI_COMMAND", "") in REPEATABLE
    try:
        sock.connect(path)
        agent = _peer_pid(sock)
        _send_request(sock, plugin, env, stdin, wire.GO if eager else b"")
        reply = sock.recv(1)
        if reply == wire.SKEW:
            _report_skew(sock)
        if reply != wire.READY:
            return None
        if not eager:
            sock.sendall(wire.GO)
    except OSError:
        return None
    # Committed: the worker may be running the request now.
    sock.settimeout(ANSWER_TIMEOUT)
    try:
        code, stdout, stderr = wire.decode_answer(wire.recv_frame(sock))
    except (OSError, wire.WireError) as exc:
        command = env.get("CNI_COMMAND", "")
        if command in REPEATABLE:
            return None
        if not isinstance(exc, TimeoutError) and _dies_soon(agent):
            sys.stderr.write(f"rdma-cni: rdma-agent (pid {agent}) died during {command} ({exc}), its workers "
                             "with it: running the call in-process\n")  # fmt: skip
            return None
        return Answer(_lost_answer(stdin, command, exc), 1)
    return Answer(stdout, code, stderr)


def _report_skew(sock: socket.socket) -> None:
    """The agent refused this client's wire versions: say so (both versions are in the reason),
    since the fallback that follows is slower and a rolling update left half done is the cause."""
    try:
        reason = b"".join(wire.recv_frame(sock)).decode("utf-8", "replace")
    except (OSError, wire.WireError) as exc:
        reason = f"rdma-agent refused this client's wire versions {wire.offer()} ({exc})"
    sys.stderr.write(f"rdma-cni: {reason}; running the call in-process\n")


def _peer_pid(sock: socket.socket) -> int:
    """The pid of the process that listens on the socket (the agent), in our pid namespace; 0 when
    the kernel does not say (then the agent counts as alive: the cautious answer)."""
    try:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return 0
    return int(pid)


AGENT_DEATH_WAIT = 1.0  # seconds: a container's processes die together, not in a known order


def _dies_soon(pid: int) -> bool:
    """The agent is gone, or goes within AGENT_DEATH_WAIT: the worker's end of the connection may
    close before its agent has finished dying, when the runtime kills them all at once."""
    deadline = time.monotonic() + AGENT_DEATH_WAIT
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _alive(pid: int) -> bool:
    """False only when ``pid`` has surely exited: no such process, or a zombie not yet reaped."""
    if pid <= 0:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def _send_request(
    sock: socket.socket, plugin: str, env: Mapping[str, str], stdin: bytes, trailer: bytes = b""
) -> None:
    frame = wire.encode_request(plugin, {**env, wire.OFFER_ENV: wire.offer()}, stdin) + trailer
    fds: list[int] = []
    try:
        for path, flags in (("/proc/self/ns/net", 0), ("/proc/self/ns/mnt", 0), ("/", os.O_DIRECTORY)):
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags))
        sent = socket.send_fds(sock, [frame], fds)
    finally:
        for fd in fds:
            os.close(fd)
    if sent < len(frame):
        sock.sendall(frame[sent:])


def _lost_answer(stdin: bytes, command: str, exc: Exception) -> str:
    import json  # only on this rare path

    try:
        version = json.loads(stdin).get("cniVersion") or "1.0.0"
    except Exception:  # noqa: BLE001 - any undecodable stdin: answer in a version every runtime reads
        version = "1.0.0"
    msg = (
        f"rdma-agent stopped answering during {command} ({exc}); the attachment's state is recorded, "
        "so DEL (or the agent's reconcile) restores the host; retry the pod"
    )
    return json.dumps({"cniVersion": str(version), "code": TRY_AGAIN_LATER, "msg": msg})


def try_agent(plugin_name: str) -> int | None:
    """Forward this process's CNI call to the agent; print its answer and return the exit code.

    None: the agent is absent or refused, nothing was printed, and the caller runs the plugin
    in-process. Standard input is read here and put back as ``sys.stdin`` so the caller reads the
    same bytes.
    """
    env = os.environ
    if env.get(DISABLE_ENV) == "off" or not env.get("CNI_COMMAND"):
        return None
    path = socket_path(env)
    if not os.path.exists(path):
        return None
    stdin = sys.stdin.buffer.read() if sys.stdin is not None else b""
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        timeout = float(env.get(TIMEOUT_ENV) or READY_TIMEOUT)
    except ValueError:
        timeout = READY_TIMEOUT
    answer = forward(plugin_name, env, stdin, timeout, path)
    if answer is None:
        return None
    if answer.stderr:
        sys.stderr.write(answer.stderr)
        sys.stderr.flush()
    sys.stdout.write(answer.stdout)
    sys.stdout.flush()
    return answer.code
