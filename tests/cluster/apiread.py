"""The harness's read-only polls of the API server, in process: one keep-alive HTTPS connection as the
cluster's admin, instead of a ``kubectl get`` per poll.

Why: the suite is CPU-bound on this 2-core machine, and process accounting of a full run showed 628
kubectl processes at ~94 ms of CPU each (59 CPU-seconds; the e2e file alone: 399 processes, 39 s),
nearly all of them polls (:func:`cluster.workloads.wait` checks every 0.5 s: the pods of a selector,
a node's capacity, the ResourceSlices). Each one is an ``ip netns exec`` and a Go binary that loads
the kubeconfig, makes a TLS session and discovers the API; a GET on a connection that is already up
costs under a millisecond of CPU here (100 pod-list reads: 0.09 s). With these reads the e2e file
starts 98 kubectl processes (9 CPU-s), the DRA file 62. What a user types (apply, scale, exec,
rollout status, auth can-i, describe, the diagnostics of ``workloads.report``) stays ``kubectl``.

The API server listens only in node 1's network namespace, so the socket is created there: a
short-lived thread enters ``/run/netns/<node 1>`` (rdma_cni.net.netns: opened read-only, checked to be
a netns), connects and leaves; the socket keeps that netns and is used from any thread afterwards.
The client identity and CA are the ones admin.kubeconfig names (tests/cluster/pki.py), the server is
verified against that CA, and they are read again when the PKI changes (a new ``up``).

A failed read raises :class:`ReadError` (a RuntimeError, as ``kubectl(check=True)`` raised): the API
server stopped (the fault tests stop and start it), refused, or answered an error status (404 has
``status == 404``). A connection the server closed or a restarted server broke is made again, once
per read, before the read counts as failed.
"""

from __future__ import annotations

import errno
import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cluster import topology as topo
from cluster.node import WORK
from rdma_cni.net.netns import NetnsUnavailable, entered, open_netns

KUBECONFIG = WORK / "pki" / "admin.kubeconfig"
NETNS_DIR = Path("/run/netns")
TIMEOUT = 30.0  # seconds for the connect and for each read of a response


class ReadError(RuntimeError):
    """A GET that did not give an object: ``status`` is the HTTP status, or None when no answer came."""

    def __init__(self, path: str, message: str, status: int | None = None) -> None:
        super().__init__(f"GET {path}: {message}")
        self.path = path
        self.status = status


@dataclass(frozen=True)
class _Identity:
    host: str
    port: int
    context: ssl.SSLContext
    files: tuple[Path, ...]  # the kubeconfig and the files it names
    stamp: tuple[int, ...]  # their inodes and mtimes: a new PKI (a new ``up``) is read again


def _stamp(paths: tuple[Path, ...]) -> tuple[int, ...]:
    out: list[int] = []
    for p in paths:
        st = p.stat()
        out += [st.st_ino, st.st_mtime_ns]
    return tuple(out)


def _load_identity() -> _Identity:
    doc: dict[str, Any] = yaml.safe_load(KUBECONFIG.read_text())
    cluster = doc["clusters"][0]["cluster"]
    user = doc["users"][0]["user"]
    ca = Path(cluster["certificate-authority"])
    cert, key = Path(user["client-certificate"]), Path(user["client-key"])
    url = urllib.parse.urlsplit(cluster["server"])
    if url.scheme != "https" or url.hostname is None:
        raise ValueError(f"server {cluster['server']!r} is not https://host:port")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    files = (KUBECONFIG, ca, cert, key)
    return _Identity(url.hostname, url.port or 443, ctx, files, _stamp(files))


def connect_in_netns(netns: str, host: str, port: int, timeout: float = TIMEOUT) -> socket.socket:
    """A TCP socket connected to ``host:port`` from inside the named netns (``ip netns`` names it
    under /run/netns). The connect runs in a thread of its own that enters the netns, so the caller's
    thread never leaves its own. OSError when the netns is gone (the cluster is down) or the connect
    fails."""
    result: list[socket.socket] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            with open_netns(str(NETNS_DIR / netns)) as ns, entered(ns):
                result.append(socket.create_connection((host, port), timeout=timeout))
        except NetnsUnavailable as e:
            error.append(FileNotFoundError(errno.ENOENT, str(e)))
        except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
            error.append(e)

    t = threading.Thread(target=run, name=f"connect-in-{netns}", daemon=True)
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


class _Connection(http.client.HTTPSConnection):
    """HTTPSConnection whose socket is made in node 1's netns."""

    def __init__(self, ident: _Identity, netns: str) -> None:
        super().__init__(ident.host, ident.port, timeout=TIMEOUT, context=ident.context)
        self._netns = netns
        self._ctx = ident.context

    def connect(self) -> None:
        raw = connect_in_netns(self._netns, self.host, self.port, TIMEOUT)
        try:
            self.sock = self._ctx.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise


class Client:
    """One keep-alive connection, one read at a time (a lock: the harness may poll from threads)."""

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self._lock = threading.Lock()
        self._ident: _Identity | None = None
        self._conn: _Connection | None = None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self, path: str) -> tuple[_Connection, bool]:
        """The connection (made now or reused) and whether it was already up."""
        if self._ident is not None:
            try:
                same = _stamp(self._ident.files) == self._ident.stamp
            except OSError:
                same = False
            if not same:
                self._drop()
                self._ident = None
        if self._ident is None:
            try:
                self._ident = _load_identity()
            except (OSError, ValueError, KeyError, TypeError, ssl.SSLError) as e:
                raise ReadError(path, f"{KUBECONFIG}: {e}") from None
        if self._conn is not None:
            return self._conn, True
        self._conn = _Connection(self._ident, self.netns)
        return self._conn, False

    def get(self, path: str) -> dict[str, Any]:
        """The object (or list) at the API path ``path``, decoded; raises :class:`ReadError`."""
        with self._lock:
            for attempt in (0, 1):
                conn, reused = self._connection(path)
                try:
                    conn.request("GET", path, headers={"Accept": "application/json"})
                    resp = conn.getresponse()
                    body = resp.read()
                except (OSError, http.client.HTTPException) as e:
                    self._drop()
                    if reused and attempt == 0:
                        continue  # a keep-alive the server closed, or a server that restarted
                    raise ReadError(path, f"{type(e).__name__}: {e}") from None
                if resp.will_close:
                    self._drop()
                if resp.status != 200:
                    raise ReadError(path, _status_message(resp.status, body), resp.status)
                try:
                    doc: dict[str, Any] = json.loads(body)
                except ValueError as e:
                    raise ReadError(path, f"not JSON: {e}", resp.status) from None
                return doc
        raise AssertionError("unreachable")


def _status_message(status: int, body: bytes) -> str:
    """The API's Status message (what kubectl prints as its error), else the status line."""
    try:
        msg = json.loads(body).get("message")
    except (ValueError, AttributeError):
        msg = None
    return f"{status}: {msg}" if msg else f"{status}: {body[:200]!r}"


_client: Client | None = None
_client_lock = threading.Lock()


def client() -> Client:
    """The process's client of the test cluster's API server (node 1's netns)."""
    global _client
    with _client_lock:
        if _client is None:
            _client = Client(topo.node_netns(1))
        return _client


def get(path: str) -> dict[str, Any]:
    """``kubectl get --raw PATH``, decoded; raises :class:`ReadError`."""
    return client().get(path)


def get_object(path: str) -> dict[str, Any]:
    """The object at ``path`` as ``kubectl get -o json`` gives it: without ``metadata.managedFields``
    (kubectl leaves them out unless ``--show-managed-fields``)."""
    return _as_kubectl(get(path))


def get_list(path: str, query: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The items of the list at ``path`` as ``kubectl get -o json`` gives them: the API leaves each
    item's ``kind`` and ``apiVersion`` to the list (``PodList``, ``v1``), kubectl writes them in."""
    doc = get(path + ("?" + urllib.parse.urlencode(query) if query else ""))
    kind = str(doc.get("kind", "")).removesuffix("List")
    items: list[dict[str, Any]] = doc.get("items") or []
    return [_as_kubectl({"apiVersion": doc.get("apiVersion"), "kind": kind, **item}) for item in items]


def _as_kubectl(doc: dict[str, Any]) -> dict[str, Any]:
    meta = doc.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return doc


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def node(name: str) -> dict[str, Any]:
    """``kubectl get node NAME -o json``."""
    return get_object(f"/api/v1/nodes/{_q(name)}")


def pod(name: str, namespace: str = "default") -> dict[str, Any]:
    """``kubectl get pod NAME -n NAMESPACE -o json``."""
    return get_object(f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}")


def pods(selector: str, namespace: str = "default") -> list[dict[str, Any]]:
    """The items of ``kubectl get pods -n NAMESPACE -l SELECTOR -o json``."""
    return get_list(f"/api/v1/namespaces/{_q(namespace)}/pods", {"labelSelector": selector})


def resourceslices() -> list[dict[str, Any]]:
    """The items of ``kubectl get resourceslices -o json`` (resource.k8s.io/v1, kubectl's preferred)."""
    return get_list("/apis/resource.k8s.io/v1/resourceslices")


def crd(name: str) -> dict[str, Any]:
    """``kubectl get crd NAME -o json``."""
    return get_object(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{_q(name)}")
