"""What the API server holds of this node's and this driver's ResourceSlices, kept by a watch, so the
publisher (:mod:`.publish`) asks the API server nothing while nothing changes.

Kubelet deletes a node's slices behind the driver's back (at its start, in the background, and when a
driver unregistered and did not come back in time: dra_plugin_manager.go's wipeResourceSlices), so the
driver cannot trust what it last wrote; a list every refresh kept it honest at 1.85 requests per idle
node-minute. Instead :class:`SliceWatch` lists once and then watches (re-watching from the last
resourceVersion when the server ends a watch, listing again on 410), and every change it sees that is
not already known wakes the publisher, which writes only when the wanted specs differ.

:class:`LiveSlices` is fed by two writers that may come out of order: the publisher's own write
answers and the watch's events. Each name keeps the newest version seen, present or deleted, ordered
by resourceVersion (comparable as integers since Kubernetes 1.35, KEP-5504; a server whose versions
are not integers is taken in arrival order), and a list at version L overrides anything at or below L.

    live = LiveSlices()
    watch = SliceWatch(api, "node-a", live, on_change=publisher.changed)
    threading.Thread(target=watch.run, args=(stop,)).start()
    live.current()   # name -> object, once live.synced
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from rdma_cni.cni.errors import CniError
from rdma_cni.kube.client import EventStream, WatchRefused

log = logging.getLogger(__name__)

Doc = dict[str, Any]

WATCH_TIMEOUT_S = 300  # client-go's minimum; each watch asks for 1x to 2x this, so nodes spread out
BACKOFF_S = 1.0  # after a failed list or watch, doubled up to BACKOFF_MAX_S, reset by a good watch
BACKOFF_MAX_S = 30.0
SHORT_WATCH_S = 1.0  # a watch the server ended this soon without an event counts as a failure


def _version(rv: str) -> int | None:
    try:
        return int(rv)
    except (TypeError, ValueError):
        return None


def _newer(rv: str, than: str) -> bool:
    """``rv`` came after ``than``; versions that are not integers are taken in arrival order."""
    a, b = _version(rv), _version(than)
    return a is None or b is None or a > b


def _not_after(rv: str, than: str) -> bool:
    """``rv`` is no later than ``than``, which arrived later when either is not an integer."""
    a, b = _version(rv), _version(than)
    return a is None or b is None or a <= b


def _meta(obj: Doc) -> Doc:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


class LiveSlices:
    """The newest known version of each slice of ours; thread-safe. Each update says whether the
    view changed, i.e. whether it told us something we did not know."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sync = threading.Lock()  # one list at a time: the publisher's and the watch's
        self._known: dict[str, tuple[str, Doc | None]] = {}  # name -> (resourceVersion, object or deleted)
        self._floor = ""  # the last list's resourceVersion: nothing at or below it is news
        self.synced = False

    def current(self) -> dict[str, Doc]:
        with self._lock:
            return {name: obj for name, (_, obj) in self._known.items() if obj is not None}

    def _stale(self, name: str, rv: str) -> bool:
        if self._floor and not _newer(rv, self._floor):
            return True
        known = self._known.get(name)
        return known is not None and not _newer(rv, known[0])

    def apply(self, obj: Doc) -> bool:
        """A slice as the server answered or a watch event carried it."""
        meta = _meta(obj)
        name, rv = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
        with self._lock:
            if not name or self._stale(name, rv):
                return False
            self._known[name] = (rv, obj)
            return True

    def remove(self, name: str, rv: str) -> bool:
        """``name`` deleted at ``rv`` (a DELETED event's object carries the deletion's version; our own
        delete passes the version it deleted)."""
        with self._lock:
            if self._stale(name, rv):
                return False
            before = self._known.get(name)
            self._known[name] = (rv, None)
            return before is None or before[1] is not None

    def replace(self, items: list[Doc], rv: str) -> bool:
        """The state at ``rv``, from a list: what it holds, and nothing else up to ``rv``."""
        changed = False
        with self._lock:
            listed = set()
            for obj in items:
                meta = _meta(obj)
                name, item_rv = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
                listed.add(name)
                known = self._known.get(name)
                if known is None or _newer(item_rv, known[0]):
                    changed = changed or known is None or known[1] != obj
                    self._known[name] = (item_rv, obj)
            for name, (known_rv, held) in list(self._known.items()):
                if name not in listed and held is not None and _not_after(known_rv, rv):
                    self._known[name] = (rv, None)
                    changed = True
            if rv and (not self._floor or _newer(rv, self._floor)):
                self._floor = rv
            self.synced = True
        return changed

    def invalidate(self) -> None:
        """What we hold may be wrong (a write was refused): the next :meth:`sync` lists again."""
        self.synced = False

    def sync(self, list_at: Callable[[], tuple[list[Doc], str]]) -> tuple[bool, str]:
        """List unless synced; (whether the view changed, the version a watch may start from)."""
        with self._sync:
            if self.synced:
                return False, self._floor
            items, rv = list_at()
            return self.replace(items, rv), rv


class WatchApi(Protocol):
    def list_slices_at(self, node: str) -> tuple[list[Doc], str]: ...
    def watch_slices(self, node: str, resource_version: str, timeout_s: int) -> EventStream: ...


class SliceWatch:
    """List, then watch, this node's slices into ``live``; ``on_change`` after each change it did not
    know of (kubelet's wipe, another writer, the first list)."""

    def __init__(self, api: WatchApi, node: str, live: LiveSlices, on_change: Callable[[], None],
                 timeout_s: int = WATCH_TIMEOUT_S, backoff_s: float = BACKOFF_S,
                 backoff_max_s: float = BACKOFF_MAX_S) -> None:
        self._api = api
        self.node = node
        self._live = live
        self._on_change = on_change
        self._timeout_s = timeout_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._stream: EventStream | None = None
        self._lock = threading.Lock()
        self.watches = 0  # watches opened, for the logs and the tests
        self.relists = 0  # lists after a 410

    def stop(self) -> None:
        """End the open watch now (with the stop event set, :meth:`run` returns)."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    def run(self, stop: threading.Event) -> None:
        rv: str | None = None  # None: list first
        pause = self._backoff_s
        while not stop.is_set():
            listed = False
            try:
                if rv is None or not self._live.synced:
                    changed, rv = self._live.sync(lambda: self._api.list_slices_at(self.node))
                    listed = True
                    if changed:
                        self._on_change()
                rv, good = self._watch_once(rv, stop)
            except WatchRefused as e:
                if e.status != 410:
                    log.warning("watching ResourceSlices failed (%s); again in %gs", e.msg, pause)
                else:
                    self.relists += 1
                    self._live.invalidate()
                    rv = None
                    if not listed:  # resumed from an old version: list again now, as client-go does
                        log.info("the watch of node %s's ResourceSlices is too old (410): listing again",
                                 self.node)
                        continue
                    log.warning("a watch from a fresh list of node %s's ResourceSlices was too old (410): "
                                "listing again in %gs", self.node, pause)
            except CniError as e:
                log.warning("watching ResourceSlices failed (%s); again in %gs", e.msg, pause)
            except Exception:  # a bug or a malformed answer: the thread must live on
                log.exception("watching ResourceSlices failed; again in %gs", pause)
            else:
                if good:
                    pause = self._backoff_s
                    continue
            stop.wait(pause * random.uniform(0.8, 1.2))  # jitter: a control-plane restart meets every node
            pause = min(pause * 2, self._backoff_max_s)

    def _watch_once(self, rv: str, stop: threading.Event) -> tuple[str, bool]:
        """One watch from ``rv`` until the server ends it; the version to go on from, and whether it
        was a good one (events came, or it lasted). A short empty one is returned as not good, so a
        server that closes at once is not asked again in a tight loop."""
        timeout = int(self._timeout_s * random.uniform(1.0, 2.0))
        stream = self._api.watch_slices(self.node, rv, timeout)
        with self._lock:
            self._stream = stream
        if stop.is_set():  # stop() ran before the stream was registered
            stream.close()
        self.watches += 1
        t0 = time.monotonic()
        seen = False
        try:
            for event in stream:
                seen = True
                kind, obj = event.get("type"), event.get("object")
                obj = obj if isinstance(obj, dict) else {}
                if kind == "ERROR":
                    code = int(obj.get("code") or 0)
                    raise WatchRefused(code, f"the watch ended with {code}: {obj.get('message', '')}")
                event_rv = str(_meta(obj).get("resourceVersion", ""))
                if kind in ("ADDED", "MODIFIED"):
                    changed = self._live.apply(obj)
                elif kind == "DELETED":
                    changed = self._live.remove(str(_meta(obj).get("name", "")), event_rv)
                    if changed:
                        log.info("ResourceSlice %s was deleted by someone else (kubelet's wipe?): "
                                 "publishing again", _meta(obj).get("name"))
                else:  # BOOKMARK: only a version to resume from
                    changed = False
                if event_rv:
                    rv = event_rv
                if changed:
                    self._on_change()
        finally:
            with self._lock:
                self._stream = None
        return rv, seen or time.monotonic() - t0 >= SHORT_WATCH_S
