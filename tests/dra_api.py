"""A loopback API server for the DRA driver's tests: :class:`kube_server.KubeServer` (real TLS, token
or client-certificate auth, scripted failures, a network namespace to listen in) plus what the
driver calls of ``resource.k8s.io/v1`` and the core API:

- ``GET .../namespaces/{ns}/resourceclaims/{name}``: the claims added with :meth:`DraApi.add_claim`;
- ``GET /api/v1/nodes/{name}``: a Node with a uid;
- ``GET/POST /apis/resource.k8s.io/v1/resourceslices`` (the list filtered by the ``spec.nodeName`` and
  ``spec.driver`` field selectors, with the list's resourceVersion), ``PUT``/``DELETE
  .../resourceslices/{name}`` with resourceVersion checks (409 on a stale one, as the real server), 409
  on a POST of an existing name; a DELETE answers the object at the deletion's version, as etcd3's
  store does;
- ``GET .../resourceslices?watch=1``: a chunked stream of the events after ``resourceVersion`` that
  match the field selectors, then each new one, a ``BOOKMARK`` every ``bookmark_s`` when asked for,
  ended after ``timeoutSeconds`` (or ``watch_timeout_s``, or :meth:`end_watches`); a version older than
  the last :meth:`compact` is kube-apiserver's ``ERROR`` event with a 410 ``Expired`` Status (an HTTP
  410 with ``gone_as_status``). Writes by "someone else" (kubelet's wipe: :meth:`delete_node_slices`)
  go through the same event log without being a request of the driver's.

    with Pki(tmp) as pki, DraApi(pki, netns=node) as api:
        claim = api.add_claim("default", "nics", [("nic", "bond0"), ("nic", "bond1")], node="node-a")
        api.driver_calls()    # the requests that were not watches
"""

from __future__ import annotations

import copy
import json
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any

from kube_server import KubeServer, Pki, _handler_for, _status, _TlsServer, in_netns

DRIVER = "rdma.tke.cloud.tencent.com"


class _NoDelayServer(_TlsServer):
    """TCP_NODELAY on every connection, as Go's net/http (kube-apiserver) has by default: without it
    the handler's separate header and body writes meet the client's delayed ACK, 40 ms a request,
    which is this fake's cost and not the driver's."""

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, addr


class DraApi(KubeServer):
    def __init__(self, pki: Pki, netns: str | None = None, node: str = "node-a") -> None:
        super().__init__(pki, netns)
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.node_name = node
        self.node_uid = str(uuid.uuid4())
        self._version = 100
        self.slice_writes: list[tuple[str, str]] = []  # (method, name)
        self.events: list[tuple[int, str, dict[str, Any]]] = []  # (resourceVersion, type, object)
        self._compacted = 0  # watches from a version below this are told 410
        self._watch_epoch = 0  # raised by end_watches: every open watch ends
        self._changed = threading.Condition(self._lock)
        self.watch_timeout_s: float | None = None  # ends every watch this soon, whatever it asked for
        self.bookmark_s: float | None = None
        self.gone_as_status = False
        self.wipe_after_create = False  # kubelet's background wipe lands right after the next POST
        self.open_watches = 0
        self.bookmarks_sent: list[str] = []
        self._closing = False

    def driver_calls(self) -> list[dict[str, Any]]:
        """The requests that were not watches: what the idle cost is counted in."""
        return [r for r in self.requests if "watch=1" not in r["path"]]

    def watch_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if "watch=1" in r["path"]]

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        """Record one change at the current version; the lock is held."""
        self.events.append((self._version, kind, copy.deepcopy(obj)))
        self._changed.notify_all()

    def delete_node_slices(self, node: str = "") -> list[str]:
        """Delete every slice of ``node`` (all drivers), as kubelet's wipeResourceSlices does with a
        DeleteCollection: not a request of the driver's, but seen by its watch."""
        with self._lock:
            node = node or self.node_name
            gone = [n for n, s in self.slices.items() if _field(s, "spec.nodeName") == node]
            for name in gone:
                obj = self.slices.pop(name)
                self._version += 1
                obj["metadata"]["resourceVersion"] = str(self._version)
                self._event("DELETED", obj)
        return gone

    def compact(self) -> None:
        """Other writes (other nodes, other resources), then etcd's compaction of all of it: a watch
        from any version seen so far gets 410."""
        with self._lock:
            self._version += 1
            self._compacted = self._version
            self.events.clear()

    def touch_other_node(self) -> None:
        """A write the node's watch does not match (another node's slice): only the version moves."""
        with self._lock:
            self._version += 1
            meta = {"name": "node-b-slice", "resourceVersion": str(self._version)}
            self._event("MODIFIED", {"metadata": meta, "spec": {"nodeName": "node-b", "driver": DRIVER}})

    def end_watches(self) -> None:
        """End every open watch now, as an API server restarting or rebalancing does."""
        with self._lock:
            self._watch_epoch += 1
            self._changed.notify_all()

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            self._changed.notify_all()
        super().stop()

    def add_claim(self, namespace: str, name: str, results: list[tuple[str, str]], node: str = "",
                  uid: str | None = None, driver: str = DRIVER, allocated: bool = True) -> dict[str, Any]:
        """A ResourceClaim allocated ``results`` = [(request, device)] of ``driver`` in pool ``node``."""
        pool = node or self.node_name
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                         "resourceVersion": "7"},
            "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": "rdma"}}
                                              for r in dict.fromkeys(r for r, _ in results)]}},
            "status": {},
        }
        if allocated:
            claim["status"]["allocation"] = {"devices": {"results": [
                {"request": r, "driver": driver, "pool": pool, "device": d} for r, d in results]}}
        self.claims[(namespace, name)] = claim
        return claim

    def get_count(self, kind: str) -> int:
        return sum(1 for r in self.requests if r["method"] == "GET" and f"/{kind}" in r["path"])

    def start(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.pki.server_cert), str(self.pki.server_key))
        ctx.load_verify_locations(str(self.pki.ca_cert))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        base = _handler_for(self)

        server = self

        class Handler(base):  # type: ignore[valid-type, misc]
            def _reply(self, status: int, body: Any) -> None:
                if isinstance(body, _Watch):
                    self.close_connection = True
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        server._stream(body, self._chunk)
                        self.wfile.write(b"0\r\n\r\n")
                    except OSError:
                        pass  # the client went away
                    return
                super()._reply(status, body)

            def _chunk(self, event: dict[str, Any]) -> None:
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

        if self.netns:
            with in_netns(self.netns):
                httpd = _NoDelayServer(("127.0.0.1", 0), Handler, ctx)
        else:
            httpd = _NoDelayServer(("127.0.0.1", 0), Handler, ctx)
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def _answer(self, path: str, headers: dict[str, str], peer_cert: dict[str, Any] | None,
                method: str = "GET", body: bytes = b"") -> tuple[int, Any]:
        url = urllib.parse.urlsplit(path)
        parts = url.path.strip("/").split("/")
        if parts[:3] != ["apis", "resource.k8s.io", "v1"] and parts[:3] != ["api", "v1", "nodes"]:
            return super()._answer(path, headers, peer_cert, method, body)
        # The base server records the request and answers scripted failures, 401 and 403; a path it
        # does not know is a 404 from it, which means: ours to answer.
        status, answer = super()._answer(path, headers, peer_cert, method, body)
        if status != 404:
            return status, answer
        with self._lock:
            return self._resource(method, parts, urllib.parse.parse_qs(url.query), body)

    def _resource(self, method: str, parts: list[str], query: dict[str, list[str]],
                  body: bytes) -> tuple[int, Any]:
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            if parts[3] != self.node_name:
                return 404, _status(404, f'nodes "{parts[3]}" not found')
            return 200, {"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": self.node_name, "uid": self.node_uid}}
        rest = parts[3:]
        if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "resourceclaims" and method == "GET":
            claim = self.claims.get((rest[1], rest[3]))
            if claim is None:
                return 404, _status(404, f'resourceclaims.resource.k8s.io "{rest[3]}" not found')
            return 200, claim
        if rest[:1] == ["resourceslices"]:
            return self._slices(method, rest[1] if len(rest) > 1 else "", query, body)
        return 404, _status(404, "the server could not find the requested resource")

    def _slices(self, method: str, name: str, query: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        if method == "GET" and not name:
            fields = dict(f.split("=", 1) for q in query.get("fieldSelector", []) for f in q.split(","))
            if query.get("watch") == ["1"]:
                return self._watch(fields, query)
            items = [s for s in self.slices.values()
                     if all(_field(s, k) == v for k, v in fields.items())]
            return 200, {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                         "metadata": {"resourceVersion": str(self._version)}, "items": copy.deepcopy(items)}
        if method == "DELETE":
            obj = self.slices.pop(name, None)
            if obj is None:
                return 404, _status(404, f'resourceslices "{name}" not found')
            self.slice_writes.append((method, name))
            self._version += 1
            obj["metadata"]["resourceVersion"] = str(self._version)
            self._event("DELETED", obj)
            return 200, obj
        obj = json.loads(body)
        obj_name = obj["metadata"]["name"]
        if method == "POST":
            if obj_name in self.slices:
                return 409, _status(409, f'resourceslices "{obj_name}" already exists')
        elif method == "PUT":
            old = self.slices.get(name)
            if old is None:
                return 404, _status(404, f'resourceslices "{name}" not found')
            if obj["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                return 409, _status(409, "the object has been modified")
        else:
            return 405, _status(405, "method not allowed")
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        _canonical_capacities(obj)
        self.slices[obj_name] = obj
        self.slice_writes.append((method, obj_name))
        self._event("ADDED" if method == "POST" else "MODIFIED", obj)
        answer = copy.deepcopy(obj)
        if method == "POST" and self.wipe_after_create:
            self.wipe_after_create = False
            del self.slices[obj_name]
            self._version += 1
            obj["metadata"]["resourceVersion"] = str(self._version)
            self._event("DELETED", obj)
        return (201 if method == "POST" else 200), answer

    def _watch(self, fields: dict[str, str], query: dict[str, list[str]]) -> tuple[int, Any]:
        rv = int((query.get("resourceVersion") or ["0"])[0] or 0)
        if rv and rv < self._compacted and self.gone_as_status:
            return 410, {**_status(410, f"too old resource version: {rv} ({self._compacted})"),
                         "reason": "Expired"}
        timeout = float((query.get("timeoutSeconds") or ["1800"])[0])
        if self.watch_timeout_s is not None:
            timeout = min(timeout, self.watch_timeout_s)
        bookmarks = query.get("allowWatchBookmarks") == ["true"]
        return 200, _Watch(fields, rv or self._version, time.monotonic() + timeout, bookmarks)

    def _stream(self, w: _Watch, send: Any) -> None:
        """Send ``w``'s events until it times out or is ended; called without the lock."""
        with self._lock:
            self.open_watches += 1
            epoch = self._watch_epoch
            expired = w.rv < self._compacted
        try:
            if expired:
                send({"type": "ERROR", "object": {**_status(410, f"too old resource version: {w.rv} "
                                                              f"({self._compacted})"), "reason": "Expired"}})
                return
            cursor, last_bookmark = w.rv, time.monotonic()
            while True:
                with self._lock:
                    pending = [(v, k, o) for v, k, o in self.events
                               if v > cursor and all(_field(o, f) == want for f, want in w.fields.items())]
                    if not pending:
                        now = time.monotonic()
                        wait = w.deadline - now
                        if w.bookmarks and self.bookmark_s is not None:
                            wait = min(wait, last_bookmark + self.bookmark_s - now)
                        if wait > 0 and not self._closing and epoch == self._watch_epoch:
                            self._changed.wait(wait)
                    ended = (time.monotonic() >= w.deadline or self._closing or epoch != self._watch_epoch)
                    current = self._version
                for v, kind, obj in pending:
                    send({"type": kind, "object": obj})
                    cursor = v
                if ended:
                    return
                if w.bookmarks and self.bookmark_s is not None \
                        and time.monotonic() - last_bookmark >= self.bookmark_s:
                    send({"type": "BOOKMARK", "object": {"kind": "ResourceSlice",
                                                         "apiVersion": "resource.k8s.io/v1",
                                                         "metadata": {"resourceVersion": str(current)}}})
                    cursor, last_bookmark = max(cursor, current), time.monotonic()
                    self.bookmarks_sent.append(str(current))
        finally:
            with self._lock:
                self.open_watches -= 1


@dataclass
class _Watch:
    fields: dict[str, str]
    rv: int
    deadline: float
    bookmarks: bool


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for key in path.split("."):
        value = value.get(key, {}) if isinstance(value, dict) else {}
    return value if isinstance(value, str) else ""


_SUFFIXES = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def _canonical(q: str) -> str:
    """A whole-number decimal quantity in the form kube-apiserver stores it (resource.Quantity's
    canonical DecimalSI): trailing zeros folded into k, M, G... ("1000" is kept as "1k")."""
    if not q.isdigit() or int(q) == 0:
        return q
    n, exp = int(q), 0
    while n % 1000 == 0 and exp < 18:
        n, exp = n // 1000, exp + 3
    return f"{n}{_SUFFIXES[exp]}"


def _canonical_capacities(obj: dict[str, Any]) -> None:
    """What the real server does to a slice's consumable capacities on write: the quantities come
    back canonical, not as sent."""
    for dev in obj.get("spec", {}).get("devices", []):
        for cap in (dev.get("capacity") or {}).values():
            cap["value"] = _canonical(str(cap["value"]))
            policy = cap.get("requestPolicy") or {}
            if "default" in policy:
                policy["default"] = _canonical(str(policy["default"]))
            for k, v in (policy.get("validRange") or {}).items():
                policy["validRange"][k] = _canonical(str(v))
