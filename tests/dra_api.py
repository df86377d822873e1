"""A loopback API server for the DRA driver's tests: :class:`kube_server.KubeServer` (real TLS, token
or client-certificate auth, scripted failures, a network namespace to listen in) plus what the
driver calls of ``resource.k8s.io/v1`` and the core API:

- ``GET .../namespaces/{ns}/resourceclaims/{name}``: the claims added with :meth:`DraApi.add_claim`;
- ``GET /api/v1/nodes/{name}``: a Node with a uid;
- ``GET/POST /apis/resource.k8s.io/v1/resourceslices`` (the list filtered by the ``spec.nodeName`` and
  ``spec.driver`` field selectors), ``PUT``/``DELETE .../resourceslices/{name}`` with resourceVersion
  checks (409 on a stale one, as the real server), 409 on a POST of an existing name.

    with Pki(tmp) as pki, DraApi(pki, netns=node) as api:
        claim = api.add_claim("default", "nics", [("nic", "bond0"), ("nic", "bond1")], node="node-a")
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import urllib.parse
import uuid
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

        class Handler(base):  # type: ignore[valid-type, misc]
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
            items = [s for s in self.slices.values()
                     if all(_field(s, k) == v for k, v in fields.items())]
            return 200, {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "items": items}
        if method == "DELETE":
            if self.slices.pop(name, None) is None:
                return 404, _status(404, f'resourceslices "{name}" not found')
            self.slice_writes.append((method, name))
            return 200, _status(200, "deleted")
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
        self.slices[obj_name] = obj
        self.slice_writes.append((method, obj_name))
        return (201 if method == "POST" else 200), obj


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for key in path.split("."):
        value = value.get(key, {}) if isinstance(value, dict) else {}
    return value if isinstance(value, str) else ""
