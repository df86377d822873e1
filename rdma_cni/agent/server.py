"""The agent's main loop: own the socket, fork a worker per connection, reap, reconcile on a timer.

The parent stays single-threaded and holds no sockets but the listening one, so a fork copies only
imported modules; ``gc.freeze()`` after the warm-up keeps those pages shared between workers.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rdma_cni.agent import namespaces, worker
from rdma_cni.agent.plugins import Registry

log = logging.getLogger("rdma-agent")

MAX_WORKERS = 32  # beyond this a call is refused and runs in-process: the node is overloaded anyway
WARM_MODULES = (
    "rdma_cni.cni.dispatch",
    "rdma_cni.plugins.macvlan",
    "rdma_cni.plugins.multus",
    "pyroute2.iproute.linux",
    "pydantic",
)


@dataclass
class AgentConfig:
    socket_path: str
    reconcile_interval: float = 60.0  # 0: only once at start; <0: never
    max_workers: int = MAX_WORKERS
    targets: dict[str, str] | None = None


@dataclass
class Agent:
    config: AgentConfig
    reconcile: Callable[[], None] | None = None
    registry: Registry = field(init=False)
    workers: set[int] = field(default_factory=set)
    _listener: socket.socket | None = None
    _lock_fd: int = -1
    _inode: int | None = None
    _stop: bool = False

    def __post_init__(self) -> None:
        self.registry = Registry(self.config.targets)

    def warm_up(self) -> list[str]:
        import importlib

        for name in WARM_MODULES:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                log.info("warm-up: %s not importable (%s)", name, exc)
        served = self.registry.preload()
        namespaces.warm()
        gc.collect()
        gc.freeze()
        return served

    def bind(self) -> None:
        """Take the single-instance lock, then publish a 0600 socket atomically (bind elsewhere, rename)."""
        path = self.config.socket_path
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o755, exist_ok=True)
        self._lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise RuntimeError(f"another rdma-agent holds {path}.lock") from exc
        tmp = f"{path}.{os.getpid()}.tmp"
        _unlink(tmp)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(tmp)
        finally:
            os.umask(old_umask)
        os.chmod(tmp, 0o600)
        os.chown(tmp, 0, 0)
        sock.listen(128)
        os.rename(tmp, path)
        sock.set_inheritable(False)
        self._listener = sock
        self._inode = os.stat(path).st_ino

    def serve(self) -> None:
        assert self._listener is not None, "bind() first"
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        next_reconcile = time.monotonic() if self.config.reconcile_interval >= 0 else float("inf")
        try:
            while not self._stop:
                self.reap()
                if time.monotonic() >= next_reconcile:
                    self.spawn_reconcile()
                    interval = self.config.reconcile_interval
                    next_reconcile = time.monotonic() + interval if interval > 0 else float("inf")
                timeout = min(1.0, max(0.0, next_reconcile - time.monotonic()))
                if sel.select(timeout):
                    self.accept_one()
        finally:
            sel.close()
            self.close()

    def accept_one(self) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EINTR, errno.ECONNABORTED):
                log.warning("accept: %s", exc)
            return
        try:
            if len(self.workers) >= self.config.max_workers:
                self.reap()
            if len(self.workers) >= self.config.max_workers:
                log.warning("%d workers busy: refusing a call (it runs in-process)", len(self.workers))
                try:
                    conn.sendall(b"N")
                except OSError:
                    pass
                return
            pid = self._fork(lambda: worker.handle(conn, self.registry))
            self.workers.add(pid)
        finally:
            conn.close()

    def spawn_reconcile(self) -> None:
        if self.reconcile is None:
            return
        job = self.reconcile
        self.workers.add(self._fork(job))

    def _fork(self, body: Callable[[], None]) -> int:
        pid = os.fork()
        if pid:
            return pid
        # Worker: run the body and leave without unwinding into the parent's loop. os._exit is the
        # only way out of a forked child that must not run the parent's cleanup.
        code = 0
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if self._listener is not None:
                self._listener.close()
            body()
        except BaseException:  # report and leave; the parent keeps serving
            log.exception("worker failed")
            code = 1
        finally:
            os._exit(code)

    def reap(self) -> None:
        for pid in list(self.workers):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.workers.discard(pid)

    def _on_stop(self, signum: int, _frame: object) -> None:
        log.info("signal %d: stopping (running workers finish their calls)", signum)
        self._stop = True

    def close(self) -> None:
        """Remove the socket only if it is still ours (a newer agent may have replaced it)."""
        if self._listener is not None:
            try:
                if self._inode is not None and _socket_inode(self.config.socket_path) == self._inode:
                    _unlink(self.config.socket_path)
            finally:
                self._listener.close()
                self._listener = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _socket_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
