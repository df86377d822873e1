"""One CNI call in a forked worker: take the request, become the caller, run the plugin, answer.

Why forked workers: the plugin code switches the netns of its thread, holds node-wide locks, and
configures logging per config — all per-process state. A worker is a copy of the warm agent that
serves calls one at a time, each from the state a fresh fork would have: the agent's namespaces,
the caller's environment, no plugin log file, no thread or descriptor left by the call before
(:func:`unfit_for_another_call`; a worker that cannot show that exits). A worker that is killed
takes nothing with it but its own call.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import struct
import sys
import time

from rdma_cni import log as plugin_log
from rdma_cni.agent import namespaces, wire
from rdma_cni.agent.metrics import events as metrics_events
from rdma_cni.agent.plugins import Registry, UnknownPlugin
from rdma_cni.cni import dispatch

log = logging.getLogger("rdma-agent")

HANDSHAKE_TIMEOUT = 10.0  # the client sends GO right after READY; a silent one is gone
STDERR_LIMIT = 64 * 1024  # what the worker's stderr may carry back (the log file has everything)
_PEERCRED = struct.Struct("3i")


class Refused(Exception):
    """The worker will not run this call; the client falls back to running it in-process."""

    reply = wire.REFUSE


class Skewed(Refused):
    """The client offered no wire version this agent speaks (:func:`wire.agree`)."""

    def __init__(self, offered: wire.Range) -> None:
        super().__init__(wire.skew_reason(offered))
        # A client that offered 2 or later reads the reason; a version-1 client knows only REFUSE.
        self.reply = wire.SKEW + wire.encode_items([str(self).encode()]) if offered[1] >= 2 else wire.REFUSE


def take_offer(env: dict[str, str]) -> int:
    """The wire version of this call, the client's offer taken out of the plugin's environment."""
    try:
        offered = wire.parse_offer(env.pop(wire.OFFER_ENV, None))
    except wire.WireError as exc:
        raise Refused(str(exc)) from exc
    version = wire.agree(offered)
    if version is None:
        raise Skewed(offered)
    return version


def peer_uid(conn: socket.socket) -> int:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return int(_PEERCRED.unpack(raw)[1])


def handle(conn: socket.socket, registry: Registry, anchors: namespaces.CodeAnchors | None = None) -> None:
    """Serve one connection to the end; never raises (the caller is a forked child about to exit)."""
    try:
        conn.settimeout(HANDSHAKE_TIMEOUT)
        plugin, env, stdin = _accept_call(conn, registry, anchors or {})
    except Refused as why:
        log.info("refused a call: %s", why)
        _send_quietly(conn, why.reply)
        metrics_events.report_refused()
        return
    except (OSError, wire.WireError) as exc:
        log.info("dropped a call before it ran: %s", exc)
        return
    try:
        conn.sendall(wire.READY)
        if conn.recv(1) != wire.GO:
            return  # the client gave up and will run it itself
    except OSError:
        return
    started = time.monotonic()
    usage, children, api = (resource.getrusage(resource.RUSAGE_SELF),
                            resource.getrusage(resource.RUSAGE_CHILDREN), _api_cpu())  # fmt: skip
    code, stdout, stderr = run_as_caller(registry, plugin, env, stdin)
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = _call_cpu(usage, used, children, resource.getrusage(resource.RUSAGE_CHILDREN), _api_cpu() - api)
    try:
        conn.settimeout(HANDSHAKE_TIMEOUT)
        conn.sendall(wire.encode_answer(code, stdout, stderr))
        sent: OSError | None = None
    except OSError as exc:  # the runtime killed the client: the call ran all the same
        sent = exc
    elapsed = (time.monotonic() - started) * 1000
    # After the answer went out: counting is never on the call's path (and a call whose client
    # left ran all the same, so it counts too).
    metrics_events.report_call(plugin, env.get("CNI_COMMAND", ""), metrics_events.cni_code(code, stdout),
                               elapsed / 1000, cpu)
    call = f"{plugin} {env.get('CNI_COMMAND')} {env.get('CNI_CONTAINERID', '')}/{env.get('CNI_IFNAME', '')}"
    if sent is not None:
        log.info("%s finished after its client left: %s", call, sent)
        return
    # CPU and page faults tell a worker's own cost from the node's load (copy-on-write: prefault).
    log.info("served %s: exit %d in %.1f ms (cpu %.1f ms: plugin %.1f, delegates %.1f, API %.1f; %d page "
             "faults)%s", call, code, elapsed, (cpu.plugin + cpu.delegates + cpu.kube_api) * 1000,
             cpu.plugin * 1000, cpu.delegates * 1000, cpu.kube_api * 1000, used.ru_minflt - usage.ru_minflt,
             _imported_note())  # fmt: skip


def _api_cpu() -> float:
    """The worker's CPU in Kubernetes API requests so far; 0 while no plugin loaded the client (the
    worker does not import it for them)."""
    client = sys.modules.get("rdma_cni.kube.client")
    return float(client.api_cpu_seconds()) if client is not None else 0.0


def _call_cpu(
    before: resource.struct_rusage,
    after: resource.struct_rusage,
    children_before: resource.struct_rusage,
    children_after: resource.struct_rusage,
    api: float,
) -> metrics_events.CallCpu:
    """One call's CPU by part: the worker's own minus its API requests, and the children it reaped
    (the delegates a call exec'd: a child is counted once it has been waited for, which the CNI
    invocation does before it returns)."""

    def spent(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
        return float(b.ru_utime - a.ru_utime + b.ru_stime - a.ru_stime)

    own = spent(before, after)
    return metrics_events.CallCpu(max(0.0, own - api), spent(children_before, children_after), api)


_warm_modules: frozenset[str] = frozenset()  # what the agent had imported when it forked workers


def note_warm_modules() -> None:
    """Called by the agent at the end of its warm-up, before any worker is forked."""
    global _warm_modules
    _warm_modules = frozenset(sys.modules)


def _imported_note() -> str:
    """Names the modules this worker imported: an import in a worker is paid again on every call
    (and read from the caller's mounts), so they belong in the agent's warm-up list."""
    if not _warm_modules or len(sys.modules) == len(_warm_modules):
        return ""
    new = sorted(set(sys.modules) - _warm_modules)
    return f"; imported {len(new)} modules the agent did not warm: {', '.join(new[:8])}" if new else ""


def _accept_call(
    conn: socket.socket, registry: Registry, anchors: namespaces.CodeAnchors
) -> tuple[str, dict[str, str], bytes]:
    head, fds, _, _ = socket.recv_fds(conn, 12, 4)
    try:
        if not head:
            raise wire.WireError("client hung up before sending a request")
        uid = peer_uid(conn)
        if uid not in (0, os.geteuid()):
            raise Refused(f"peer uid {uid} is not root")
        plugin, env, stdin = wire.decode_request(wire.recv_frame(conn, head))
        take_offer(env)  # versions 1 and 2 differ only in the offer: the rest of the call is the same
        if len(fds) not in (2, 3):  # 2: a client from before the root was passed (a rolling update)
            raise Refused(f"expected the caller's net and mnt namespace fds and its root, got {len(fds)} fds")
        try:
            registry.spec(plugin)
        except UnknownPlugin as exc:
            raise Refused(str(exc)) from exc
        except Exception as exc:  # a plugin that cannot load here may still run in-process
            raise Refused(f"plugin {plugin} cannot be loaded in the agent: {exc}") from exc
        try:
            moved = namespaces.enter_caller(fds[0], fds[1], fds[2] if len(fds) == 3 else None)
        except OSError as exc:
            raise Refused(f"cannot enter the caller's namespaces or root: {exc}") from exc
        mismatch = namespaces.code_mismatch(anchors) if moved else ""
        if mismatch:
            raise Refused(f"{mismatch}: run the agent from the node's install path")
    finally:
        for fd in fds:
            os.close(fd)
    return plugin, env, stdin


def run_as_caller(registry: Registry, plugin: str, env: dict[str, str], stdin: bytes) -> tuple[int, str, str]:
    """Run the call the way the CNI executable would: its environment, a fresh logging setup, its
    stderr captured to send back. Returns (exit code, stdout, stderr)."""
    _become_environment(env)
    capture = os.memfd_create("rdma-agent-stderr", os.MFD_CLOEXEC)
    agent_stderr = os.dup(2)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(capture, 1)  # nothing may print on stdout in-process either; keep it with stderr
    os.dup2(capture, 2)
    os.close(null)
    _fresh_logging()
    try:
        stdout, code = dispatch.run(env, stdin, registry.spec(plugin))
    except BaseException as exc:  # noqa: BLE001 - dispatch never raises; if it does, answer anyway
        stdout, code = "", 1
        sys.stderr.write(f"rdma-agent: {plugin} crashed: {exc!r}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    _fresh_logging()  # closes the plugin's log file: the next call in this worker opens its own
    captured = _read_tail(capture)
    os.close(capture)
    os.dup2(agent_stderr, 2)  # the agent's own log lines go to the agent's stderr again
    os.dup2(agent_stderr, 1)
    os.close(agent_stderr)
    return code, stdout, captured


def _become_environment(env: dict[str, str]) -> None:
    """Make ``os.environ`` (and the C environment a subprocess inherits) exactly the caller's,
    changing only the variables that differ. The caller's environment is mostly the agent's own,
    and clear() + update() rewrote every variable: ~130 more copy-on-write faults, 0.4 ms of a
    VERSION call in a worker that is not prefaulted."""
    current = os.environ
    for key in [key for key in current if key not in env]:
        del current[key]
    for key, value in env.items():
        if current.get(key) != value:
            current[key] = value


def _fresh_logging() -> None:
    """Forget the agent's own handlers: the plugin configures logging from its config, as cold."""
    root = logging.getLogger("rdma_cni")
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if isinstance(handler, logging.FileHandler):
            handler.close()  # the plugin's log file (the agent's own handlers are not FileHandlers)
    plugin_log._configured.clear()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def unfit_for_another_call(home: namespaces.Home, fds: int) -> str:
    """Why this worker must not serve another call ("" when it may): it is back in the agent's
    namespaces, and the call left no thread or descriptor behind. A call that leaked something is
    not trusted to have left nothing else: its worker exits, and a fresh fork takes its place."""
    import threading

    try:
        home.go_back()
    except OSError as exc:
        return f"cannot return to the agent's namespaces: {exc}"
    if threading.active_count() != 1:
        return f"the call left {threading.active_count() - 1} thread(s) running"
    native = len(os.listdir("/proc/self/task"))  # also threads Python does not know (gRPC's core)
    if native != 1:
        return f"the call left {native - 1} native thread(s) running"
    now = open_fds()
    if now != fds:
        return f"the call left {now - fds} descriptor(s) open"
    return ""


def _read_tail(fd: int) -> str:
    size = os.lseek(fd, 0, os.SEEK_END)
    os.lseek(fd, max(0, size - STDERR_LIMIT), os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 1 << 16):
        data += chunk
    return data.decode("utf-8", "replace")


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass
