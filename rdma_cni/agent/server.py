"""The agent's main loop: own the socket, keep forked workers ready, reap, reconcile.

The parent stays single-threaded and holds no sockets but the listening one, so a fork copies only
imported modules; ``gc.freeze()`` after the warm-up keeps those pages shared between workers. Up to
``warm_workers`` idle workers take their own copy of the shared pages that calls write (learned from
the workers: ``prefault.HotPages``) while they wait, so their first call does not pay those
copy-on-write faults; idle workers beyond that stay shallow (they share every page). After a call a
worker goes back to waiting, its pages already its own, for up to ``calls_per_worker`` calls: each
call still starts in the agent's namespaces with nothing left of the one before
(``worker.unfit_for_another_call``), else the worker exits and a fresh fork replaces it. A call that
finds every worker busy waits for one to come back (``queue_wait``) rather than for a fork; one more
worker is forked once it waited that long, or at once when a busy worker waits on a plugin it ran
(its delegate may be the waiting call). Idle workers beyond ``prefork`` (after a burst) are sent
SIGTERM, which an idle worker obeys at once and a busy one after its call.
"""

from __future__ import annotations

import fcntl
import functools
import gc
import logging
import os
import select
import selectors
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rdma_cni.agent import namespaces, prefault, worker
from rdma_cni.agent.metrics import events as metrics_events
from rdma_cni.agent.plugins import Registry
from rdma_cni.kube import sockets
from rdma_cni.kube.sockets import socket_inode
from rdma_cni.net.rtnl import light_pyroute2

log = logging.getLogger("rdma-agent")

MAX_WORKERS = 32  # beyond this a call is refused and runs in-process: the node is overloaded anyway
# Idle workers kept ready when no call runs (top_up), every one of them warm: each holds the pages
# calls write (prefaulted, or kept from a call: ~6 MiB of its own), so none of them pays the
# copy-on-write faults on the call path. A burst larger than that (8 pods at once on an 8-GPU node)
# queues for them (QUEUE_WAIT) instead of taking fresh, fault-paying forks: on a node's few CPUs
# four warm workers clear 8 calls sooner than 8 workers of which most must fault first.
PREFORK = 4
WARM_WORKERS = 4
# A worker serves up to this many calls before it exits: each call after its first skips the fork
# and the copy-on-write faults (~850 faults, 5-8 ms of CPU on an ADD), and the bound keeps whatever
# a call leaves in Python's heap from accumulating.
CALLS_PER_WORKER = 64
# Idle workers beyond PREFORK leave only after this long without a call: pods often start in
# bursts, and a worker kept from the last burst serves the next one without a fork or its
# copy-on-write faults (bench: 8 concurrent DELs right after 8 ADDs found 2 warm workers, not 8).
TRIM_AFTER = 3.0
# With this many calls already running a new idle worker stays shallow (each call's worker takes
# the hot pages, ~7 MiB, as its own anyway). Measured when a prefault copied every shared page:
# limits of 2 and 4 gained less in sequential pod starts (the previous call's worker often not yet
# reaped) than 6 (ADD -0.5 and -1.4 ms against -2 ms).
PREFAULT_BUSY_LIMIT = 6
# An idle worker waits this long for a call before it prefaults: in a burst of back-to-back calls
# the copying would only take CPU from the calls it is meant to speed up. For the same reason it
# copies under SCHED_IDLE: only on a CPU nothing else wants (prefault.populate_when_idle).
PREFAULT_DELAY = 0.005
# A call that finds every worker busy waits in the listen backlog for one of them to come back, for
# up to this long: a worker more would add its fork and ~850 copy-on-write faults (~8 ms of CPU, as
# much as a call) to the work the same few CPUs must do, and a warm worker serves the waiting call
# in less. 8 concurrent single-bond ADDs on 2 CPUs (scripts/bench, 7-9 bursts, against Go's wall
# time): 8 idle workers of which 2 warm 1.19x; 4 warm workers and this wait 0.83-0.88x, at 56-57
# MiB PSS idle against 49. A busy worker that waits on a child (a delegate or IPAM plugin it ran, which may
# be a call waiting here) gets no wait: one more worker is forked at once (no deadlock, no delay).
QUEUE_WAIT = 0.025
QUEUE_POLL = 0.002  # how often a waiting call's case is looked at again
METRICS_RESPAWN = 1.0  # seconds between two starts of the metrics process (one that keeps dying)
# The loop's longest sleep with nothing timed to do: connections, signals (a worker's end) and events
# wake it at once, so this is only a safety net. Every second was 0.2 millicores of an idle node.
IDLE_WAKE_CAP = 60.0
WARM_MODULES = (
    "rdma_cni.cni.dispatch",
    "rdma_cni.plugins.macvlan.plugin",
    "rdma_cni.plugins.multus.plugin",
    # What the plugin path takes from pyroute2: the message classes rdma_cni.net.rtnl builds
    # requests with, imported past pyroute2/__init__ (light_pyroute2) as the plugin itself does.
    # All of pyroute2 (IPRoute and every subsystem its __init__ loads) was ~11 MiB more for each
    # fork to copy page tables of, each prefault to copy and each worker exit to free (RSS 46 ->
    # 35 MiB); a path that still wants it imports it in the worker, as cold.
    "pyroute2.netlink.rtnl.ifaddrmsg",
    "pyroute2.netlink.rtnl.rtmsg",
    "pyroute2.netlink.rtnl.fibmsg",
)
# Mechanism and policy packages a plugin may import lazily on some path (RDMA, IPAM, multus kube).
WARM_PACKAGES = ("rdma_cni.cni", "rdma_cni.net", "rdma_cni.rdma", "rdma_cni.plugins", "rdma_cni.kube")


@dataclass
class AgentConfig:
    socket_path: str
    reconcile_interval: float = 60.0  # 0: only once at start; <0: never
    max_workers: int = MAX_WORKERS
    prefork: int = PREFORK
    warm_workers: int = WARM_WORKERS  # idle workers that may hold the hot pages as their own
    prefault: bool = True  # idle workers take their copy-on-write faults before a call (prefault.py)
    calls_per_worker: int = CALLS_PER_WORKER  # 1: a fresh fork for every call
    trim_after: float = TRIM_AFTER  # seconds a surplus idle worker is kept
    # Seconds a call may wait for a busy worker (QUEUE_WAIT); 0: never waits, one idle worker is
    # kept spare while calls run instead.
    queue_wait: float = QUEUE_WAIT
    targets: dict[str, str] | None = None


@dataclass
class Agent:
    config: AgentConfig
    reconcile: Callable[[], None] | None = None
    registry: Registry = field(init=False)
    idle: set[int] = field(default_factory=set)  # forked, waiting in accept()
    busy: set[int] = field(default_factory=set)  # serving one call each
    leaving: set[int] = field(default_factory=set)  # surplus idle workers told to exit (SIGTERM)
    served: set[int] = field(default_factory=set)  # workers that have served a call (live ones)
    prefaulted: set[int] = field(default_factory=set)  # workers forked to copy the hot pages ahead
    idle_since: dict[int, float] = field(default_factory=dict)  # monotonic time each went idle
    jobs: set[int] = field(default_factory=set)  # reconcile passes
    # The metrics process's body (metrics.server.serve, bound); None without --metrics-address.
    metrics: Callable[[], None] | None = None
    # Sockets only the metrics process keeps (its HTTP listener, the events' receiving end): every
    # other child closes them at once, so a worker that outlives a killed agent holds no port.
    metrics_sockets: list[socket.socket] = field(default_factory=list)
    _metrics_pid: int = 0
    _metrics_next: float = 0.0  # monotonic time before which a dead metrics process is not replaced
    anchors: namespaces.CodeAnchors = field(default_factory=dict)
    hot: prefault.HotPages | None = None  # the pages calls write, learned from workers (prefault)
    _events: tuple[int, int] = (-1, -1)  # pipe: +pid when a worker takes a call, -pid when idle again
    _listener: socket.socket | None = None
    _lock_fd: int = -1
    _inode: int | None = None
    _stop: bool = False
    _queued_since: float | None = None  # monotonic time a call was first seen waiting for a worker

    def __post_init__(self) -> None:
        self.registry = Registry(self.config.targets)

    def warm_up(self) -> list[str]:
        """Import everything a call could need, so no worker pays for an import (or imports code
        from the caller's mount namespace)."""
        import importlib
        import pkgutil

        light_pyroute2()
        names = list(WARM_MODULES)
        for package in WARM_PACKAGES:
            try:
                path = importlib.import_module(package).__path__
            except ImportError:
                continue
            names += [info.name for info in pkgutil.iter_modules(path, package + ".")]
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - an optional module that cannot load is no reason to stop
                log.info("warm-up: %s not importable (%s)", name, exc)
        served = self.registry.preload()
        namespaces.warm()
        prefault.warm()
        if self.config.prefault and not prefault.may_idle_and_return():
            log.warning("cannot switch workers to SCHED_IDLE and back (CAP_SYS_NICE): no prefault")
            self.config.prefault = False
        self.anchors = namespaces.code_anchors()
        worker.note_warm_modules()
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
        # Before the socket is visible: a SIGTERM from then on must remove it (serve() sees _stop).
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        tmp = f"{path}.{os.getpid()}.tmp"
        _unlink(tmp)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(tmp)
        finally:
            os.umask(old_umask)
        os.chown(tmp, 0, 0)
        sock.listen(128)
        sockets.make_private(tmp)  # 0600, and its directory: nobody else may put a socket in its place
        os.rename(tmp, path)
        sock.set_inheritable(False)
        self._listener = sock
        self._inode = os.stat(path).st_ino

    def serve(self) -> None:
        """Keep ``prefork`` workers waiting in accept(), so a call never waits for a fork; reap them,
        replace the ones that took a call, and run reconcile on its timer."""
        assert self._listener is not None, "bind() first"
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        self._events = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        # A worker's death wakes the loop at once (SIGCHLD through a wakeup pipe), so a killed idle
        # worker is replaced before the next call has to be refused.
        wakeup = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        signal.set_wakeup_fd(wakeup[1], warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        sel = selectors.DefaultSelector()
        sel.register(self._events[0], selectors.EVENT_READ, "events")
        sel.register(wakeup[0], selectors.EVENT_READ, "wakeup")
        # Edge-triggered: one wake-up per arriving connection (a level-triggered watch would spin
        # until a worker accepts), to take idle workers off SCHED_IDLE (wake_idle).
        arrivals = select.epoll()
        arrivals.register(self._listener.fileno(), select.EPOLLIN | select.EPOLLET)
        sel.register(arrivals.fileno(), selectors.EVENT_READ, "arrival")
        if self.config.prefault:
            self.hot = prefault.HotPages()
            sel.register(self.hot.reader, selectors.EVENT_READ, "hot")
        listening = False
        next_reconcile = time.monotonic() if self.config.reconcile_interval >= 0 else float("inf")
        try:
            while not self._stop:
                self.reap()
                self.top_up()
                self.trim()
                self.keep_metrics()
                if time.monotonic() >= next_reconcile:
                    self.spawn_reconcile()
                    interval = self.config.reconcile_interval
                    next_reconcile = time.monotonic() + interval if interval > 0 else float("inf")
                # With no idle worker left the parent watches the backlog: a waiting call gets a
                # worker (serve_queued), or, all busy at the limit, REFUSE (the caller falls back).
                want_listen = not self.idle and self._queued_since is None
                if want_listen != listening:
                    if want_listen:
                        sel.register(self._listener, selectors.EVENT_READ, "listener")
                    else:
                        sel.unregister(self._listener)
                    listening = want_listen
                for key, _ in sel.select(self._next_wake(next_reconcile)):
                    if key.data == "events":
                        self.read_events()
                    elif key.data == "wakeup":
                        _drain(wakeup[0])
                    elif key.data == "arrival":
                        arrivals.poll(0)
                        self.wake_idle()
                    elif key.data == "hot":
                        self.learn_hot_pages()
                    else:
                        self.reap()
                        self.top_up()
                        if not self.idle:
                            self.queue_or_refuse()
                self.serve_queued()
        finally:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sel.close()
            arrivals.close()
            for fd in wakeup:
                os.close(fd)
            if self.hot is not None:
                self.hot.close()
            self.close()

    def learn_hot_pages(self) -> None:
        """Merge the workers' reports. The first one also retires the idle workers that were
        forked to be warm before anything was known (so they copied nothing): their replacements do."""
        assert self.hot is not None
        before = self.hot.size()
        if not self.hot.receive() or self.hot.size() == before:
            return
        log.info("prefault: calls write %.1f MiB of the agent's pages (learned from workers)",
                 self.hot.size() / 2**20)
        if before == 0:
            for pid in sorted(self.idle & self.prefaulted - self.served):
                self.retire(pid)

    def _next_wake(self, next_reconcile: float) -> float:
        """Seconds until the loop has timed work: the next reconcile, a surplus idle worker's
        ``trim_after``, a dead metrics process's respawn, a queued call's next look."""
        if self._queued_since is not None:
            return QUEUE_POLL
        now = time.monotonic()
        due = min(next_reconcile, now + IDLE_WAKE_CAP)
        if self.metrics is not None and not self._metrics_pid:
            due = min(due, self._metrics_next)
        surplus = len(self.idle) > self.config.prefork or len(self.warm_idle()) > self.config.warm_workers
        if self.idle and surplus:
            due = min(due, min(self.idle_since.get(pid, now) for pid in self.idle) + self.config.trim_after)
        return max(0.0, due - now)

    def top_up(self) -> None:
        """Fork idle workers up to ``prefork`` while no call runs. While calls run, none (a call
        that finds every worker busy waits for one: :meth:`serve_queued`): the fork (~1-2 ms of the
        parent's CPU copying page tables) and a fresh worker's faults or prefault would take the CPU
        the running calls and their waiting clients need (measured: the client's wake-up on READY
        lagged 1.5 ms on 2 CPUs). With ``queue_wait`` 0, one idle worker is kept while calls run."""
        cfg = self.config
        if not self.busy:
            target = cfg.prefork
        else:  # with queue_wait, a call that finds no idle worker is queue_or_refuse's
            target = 0 if cfg.queue_wait > 0 else min(cfg.prefork, 1)
        while len(self.idle) < target and len(self.idle) + len(self.busy) < cfg.max_workers:
            warm = (cfg.prefault and len(self.busy) < PREFAULT_BUSY_LIMIT
                    and len(self.warm_idle()) < cfg.warm_workers)
            self.fork_worker(warm)

    def fork_worker(self, warm: bool) -> None:
        pid = self._fork(functools.partial(self._wait_for_call, warm), die_with_parent=True)
        self.idle.add(pid)
        self.idle_since[pid] = time.monotonic()
        if warm:
            self.prefaulted.add(pid)

    def queue_or_refuse(self) -> None:
        """A call waits and no worker is idle: let it wait for one (serve_queued), or, without
        queue_wait, answer REFUSE (the caller then runs the call in-process)."""
        if self.config.queue_wait > 0 and len(self.busy) < self.config.max_workers:
            if self._queued_since is None:
                self._queued_since = time.monotonic()
            return
        self.refuse_one()

    def serve_queued(self) -> None:
        """A call waits in the backlog: done when a worker came back (it takes it) or the call is
        gone; else one more worker when a busy one waits on a child process of its own, or once the
        call waited ``queue_wait``."""
        since = self._queued_since
        if since is None:
            return
        assert self._listener is not None
        if self.idle or not prefault.readable(self._listener):
            self._queued_since = None
            return
        waited = time.monotonic() - since
        nested = any(_has_children(pid) for pid in self.busy)
        if waited < self.config.queue_wait and not nested:
            return
        self._queued_since = None  # the next waiting call (if any) waits anew
        if len(self.idle) + len(self.busy) >= self.config.max_workers:
            self.refuse_one()
            return
        log.info("a call waited %.1f ms for one of %d busy workers%s: one more worker", waited * 1000,
                 len(self.busy), " (one waits on a plugin it ran)" if nested else "")
        self.fork_worker(warm=False)

    def warm_idle(self) -> set[int]:
        """Idle workers that hold (or are copying) the hot pages as their own."""
        return self.idle & (self.served | self.prefaulted)

    def trim(self) -> None:
        """After a burst, workers that went back to waiting outnumber ``prefork``: SIGTERM the
        surplus. The signal only notes the request (it never interrupts anything): a worker leaves
        when it next looks for a connection, so one that took a call meanwhile serves it first.
        Only workers idle for ``trim_after`` go: the next burst may come soon."""
        since = time.monotonic() - self.config.trim_after
        while len(self.idle) > self.config.prefork:
            rested = {pid for pid in self.idle if self.idle_since.get(pid, 0.0) <= since}
            if not rested:
                return
            fresh = rested - self.served  # keep the workers whose pages a call already made theirs
            self.retire(min(fresh) if fresh else min(rested))
        # A burst leaves every worker that served in it holding the hot pages (~8 MiB each): beyond
        # ``warm_workers`` they go too, and top_up replaces them with shallow ones.
        while len(warm := self.warm_idle()) > self.config.warm_workers:
            rested = {pid for pid in warm if self.idle_since.get(pid, 0.0) <= since}
            if not rested:
                return
            self.retire(min(rested))

    def retire(self, pid: int) -> None:
        """SIGTERM an idle worker (it leaves when it next looks for a call: never mid-call). Back at
        normal priority first: one still copying under SCHED_IDLE on a saturated node would get no
        CPU to notice, and linger with its memory."""
        self.idle.discard(pid)
        self.leaving.add(pid)
        prefault.normal_priority(pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _wait_for_call(self, warm: bool = False) -> None:
        """A worker: take a connection, tell the parent, serve it; again while fit (up to
        ``calls_per_worker``). Dies with the parent while idle (a killed agent must not leave
        workers accepting), never while it holds a call."""
        assert self._listener is not None
        os.close(self._events[0])
        listener = self._listener
        parent = os.getppid()
        home = namespaces.Home()
        arrivals = Arrivals(listener)
        hot = self.hot
        if warm and hot is not None and hot.runs and not prefault.readable(listener, PREFAULT_DELAY):
            prefault.populate_when_idle(listener, arrivals.leaving, hot.runs)
        for served in range(1, self.config.calls_per_worker + 1):
            fds = worker.open_fds()  # what a call must leave behind: the same, once its conn is closed
            conn = arrivals.next()
            if conn is None:
                return  # told to leave (trim) while waiting
            prefault.normal_priority(0)  # whatever happened while idle, the call runs at normal priority
            namespaces.die_with_parent(False)
            os.write(self._events[1], struct.pack("!i", os.getpid()))
            try:
                worker.handle(conn, self.registry, self.anchors)
            finally:
                conn.close()
            if served == 1 and hot is not None:
                hot.report()  # what this call wrote (<1 ms): the next workers prefault it
            why = worker.unfit_for_another_call(home, fds)
            if why or served == self.config.calls_per_worker or arrivals.leaving():
                if why:
                    log.warning("worker %d exits after its call: %s", os.getpid(), why)
                return
            namespaces.die_with_parent(True)
            if os.getppid() != parent:
                return  # the agent is gone: nobody would count this worker
            os.write(self._events[1], struct.pack("!i", -os.getpid()))

    def read_events(self) -> None:
        try:
            data = os.read(self._events[0], 4096)
        except BlockingIOError:
            return
        for (pid,) in struct.iter_unpack("!i", data[: len(data) // 4 * 4]):
            if pid > 0 and pid not in self.leaving:
                self.idle.discard(pid)
                self.busy.add(pid)
                self.served.add(pid)
            elif pid < 0 and -pid in self.busy:
                self.busy.discard(-pid)
                self.idle.add(-pid)
                self.idle_since[-pid] = time.monotonic()
                log.debug("worker %d is waiting for a call again", -pid)

    def wake_idle(self) -> None:
        """A connection arrived: every idle worker back to normal priority, so one that is copying
        under SCHED_IDLE on a saturated node stops and accepts it now, not when a CPU goes idle.
        (When a worker accepts before the parent looks, the parent may see no event at all: then
        the call was taken, which is all this is for.)"""
        for pid in self.idle:
            prefault.normal_priority(pid)

    def refuse_one(self) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()  # readable, and no idle worker exists to take it
        except OSError:
            return
        log.warning("%d workers busy: refusing a call (it runs in-process)", len(self.busy))
        metrics_events.report_refused()
        try:
            conn.sendall(b"N")
        except OSError:
            pass
        finally:
            conn.close()

    def keep_metrics(self) -> None:
        """Start the metrics process, and replace it (at most once a second) when it died: the
        listener stays open here meanwhile, so a scrape then waits in its backlog, and the events
        sent meanwhile wait in the channel."""
        if self.metrics is None or self._metrics_pid or time.monotonic() < self._metrics_next:
            return
        self._metrics_next = time.monotonic() + METRICS_RESPAWN
        self._metrics_pid = self._fork(self.metrics, die_with_parent=True, metrics=True)

    def spawn_reconcile(self) -> None:
        if self.reconcile is None:
            return
        self.jobs.add(self._fork(self.reconcile))

    def _fork(self, body: Callable[[], None], die_with_parent: bool = False, metrics: bool = False) -> int:
        parent = os.getpid()
        pid = os.fork()
        if pid:
            return pid
        # Child: run the body and leave without unwinding into the parent's loop. os._exit is the
        # only way out of a forked child that must not run the parent's cleanup.
        code = 0
        try:
            if not metrics:
                for sock in self.metrics_sockets:
                    sock.close()  # this child's copy only
            if die_with_parent:
                namespaces.die_with_parent(True)
                if os.getppid() != parent:
                    os._exit(0)  # the parent died before the death signal was armed
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(signum, signal.SIG_DFL)
            gc.disable()  # a worker lives for a few calls: collecting would only cost time
            body()
        except BaseException:  # report and leave; the parent keeps serving
            log.exception("worker failed")
            code = 1
        finally:
            os._exit(code)

    def reap(self) -> None:
        for group in (self.idle, self.busy, self.jobs, self.leaving):
            for pid in list(group):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    group.discard(pid)
                    self.served.discard(pid)
                    self.prefaulted.discard(pid)
                    self.idle_since.pop(pid, None)
        if self._metrics_pid:
            try:
                done, status = os.waitpid(self._metrics_pid, os.WNOHANG)
            except ChildProcessError:
                done, status = self._metrics_pid, 0
            if done:
                log.warning("metrics process %d ended (%s): replacing it", done, _how(status))
                self._metrics_pid = 0

    def _on_stop(self, signum: int, _frame: object) -> None:
        log.info("signal %d: stopping (running workers finish their calls)", signum)
        self._stop = True

    def close(self) -> None:
        """Remove the socket only if it is still ours (a newer agent may have replaced it)."""
        if self._metrics_pid:
            try:
                os.kill(self._metrics_pid, signal.SIGTERM)
                os.waitpid(self._metrics_pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self._metrics_pid = 0
        if self._listener is not None:
            try:
                if self._inode is not None and socket_inode(self.config.socket_path) == self._inode:
                    _unlink(self.config.socket_path)
            finally:
                self._listener.close()
                self._listener = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


class Arrivals:
    """A worker's wait for its next connection, which SIGTERM (trim) ends without a race: the
    signal handler only notes the request, and the wait returns None once it is noted. (A handler
    that raised SystemExit could fire between accept() returning and the call being noted, and
    drop a connection unanswered: 2 of 240 calls in back-to-back bursts of 8.)"""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self._asked = False
        self._wakeup_r, wakeup_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.set_wakeup_fd(wakeup_w, warn_on_full_buffer=False)  # a blocked wait returns at once
        # Every idle worker waits on the same listener: the one that loses a race for a connection
        # must get EAGAIN, not block in accept() where a SIGTERM would go unseen.
        listener.setblocking(False)
        self._poll = select.epoll()
        self._poll.register(listener.fileno(), select.EPOLLIN | select.EPOLLEXCLUSIVE)
        self._poll.register(self._wakeup_r, select.EPOLLIN)

    def _on_term(self, _signum: int, _frame: object) -> None:
        self._asked = True

    def leaving(self) -> bool:
        return self._asked

    def next(self) -> socket.socket | None:
        """The next connection, or None when asked to leave; never both."""
        while not self._asked:
            events = self._poll.poll()
            if self._asked:
                return None
            if any(fd == self.listener.fileno() for fd, _ in events):
                try:
                    conn, _ = self.listener.accept()
                except BlockingIOError:
                    continue  # another worker took it
                conn.setblocking(True)
                return conn
            _drain(self._wakeup_r)
        return None


def _has_children(pid: int) -> bool:
    """The worker runs a child process now (a delegate, an IPAM plugin): /proc's children list of
    its main thread (workers are single-threaded); False when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return bool(f.read().strip())
    except OSError:
        return False


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.waitstatus_to_exitcode(status)}"


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
