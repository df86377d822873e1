"""The few Kubernetes API calls a node plugin makes, over TLS, with a deadline and bounded retries:
GET a pod, PATCH its network-status annotation (on DEL: only if it is still the same pod), GET a
NetworkAttachmentDefinition.

The API server may be restarting when a pod starts (a node reboot brings everything up at once), so
connection failures, timeouts, 429 and 5xx are retried with a short backoff until ``attempts`` or the
overall ``timeout`` runs out; 401/403/404 are answers, not outages, and are not retried. Nothing here
logs a header or a key: the token only ever goes into the request it authorises.

    client = PodClient(kubeconfig.load("/etc/cni/net.d/rdma-multus.d/kubeconfig"))
    pod = client.get_pod("default", "ibv-app-0")     # None when the pod does not exist
    client.patch_pod_annotations("default", "ibv-app-0", {"k8s.v1.cni.cncf.io/network-status": "[...]"})
    nad = client.get_network_attachment_definition("default", "rdma-net")   # the object, or None

A watch (:meth:`PodClient._watch`) is one long GET whose answer is a stream of events, one JSON object
a line; it is not retried here: whoever watches decides what a closed or refused stream means (re-watch,
relist, back off).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

from rdma_cni import __version__
from rdma_cni.cni.errors import INVALID_CONFIG, KUBE_API_FAILURE, CniError
from rdma_cni.kube.kubeconfig import KubeConfig
from rdma_cni.kube.pod import Pod

log = logging.getLogger("rdma_cni.kube")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})

_api_cpu_s = 0.0  # this process's CPU in API requests (TLS, HTTP); single-threaded callers only


def api_cpu_seconds() -> float:
    """The CPU the calling thread has spent in Kubernetes API requests so far (the TLS handshake and
    the HTTP exchange, retries included): rdma-agent's workers read it around each CNI call, so the
    metrics can tell what a pod start costs in API requests from what it costs in our own code."""
    return _api_cpu_s


class WatchRefused(CniError):
    """The API server answered a watch with ``status`` instead of a stream (410: the resourceVersion
    is too old, list again)."""

    def __init__(self, status: int, msg: str) -> None:
        super().__init__(KUBE_API_FAILURE, msg)
        self.status = status


class EventStream:
    """One open watch: iterating yields each event (``{"type": ..., "object": ...}``) until the server
    ends the stream, and then frees the connection; :meth:`close`, from any thread, ends the iteration
    at once (a driver stopping does not wait for the server's timeout)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._resp = resp
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            while not self._closed.is_set():
                try:
                    line = self._resp.readline()
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    if self._closed.is_set():  # close() shut the socket under the read
                        return
                    raise CniError(KUBE_API_FAILURE, f"Kubernetes API watch lost: {type(exc).__name__}: "
                                                     f"{exc}") from exc
                if not line:
                    return
                if line.strip():
                    try:
                        event = json.loads(line)
                    except ValueError as exc:
                        raise CniError(KUBE_API_FAILURE,
                                       "Kubernetes API sent an invalid watch event") from exc
                    if isinstance(event, dict):
                        yield event
        finally:
            # Only the reading thread frees the connection: freed under a read, http.client's
            # response would fail in ways of its own instead of seeing the end of the stream.
            self._closed.set()
            self._conn.close()

    def close(self) -> None:
        self._closed.set()
        sock = self._conn.sock
        if sock is not None:
            # The plain socket's shutdown, not SSLSocket's: that one drops its TLS object, which the
            # reading thread may be inside; this only wakes that read with an end of stream.
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass


class PodClient:
    # Each component says who it is, as client-go's "name/version": the API server's audit log and
    # its per-client request accounting (what the product costs the control plane) tell them apart.
    USER_AGENT = f"rdma-multus/{__version__}"

    def __init__(
        self, config: KubeConfig, timeout: float = 10.0, attempts: int = 3, backoff: float = 0.2
    ) -> None:
        self.config = config
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self._ssl: ssl.SSLContext | None = None

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        path = f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(name)}"
        obj = self._get_object(
            path,
            f"pod {namespace}/{name}",
            "check the kubeconfig's token or client certificate and its RBAC (get pods)",
            expected=f"a Pod for {namespace}/{name}",
        )
        if obj is None:
            return None
        if obj.get("kind", "Pod") != "Pod":
            raise CniError(
                KUBE_API_FAILURE, f"Kubernetes API sent something other than a Pod for {namespace}/{name}"
            )
        return Pod.from_api(obj)

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Set ``annotations`` with one JSON merge patch on the pod's ``status`` subresource.

        The status subresource is what Multus writes network-status through (node credentials may
        update a pod's status, not its spec), and a merge patch of only our keys neither needs a
        prior GET nor races other writers of other annotations.
        """
        status, _ = self._patch_status(namespace, name, {"annotations": annotations})
        if status == 404:
            raise CniError(KUBE_API_FAILURE, f"pod {namespace}/{name} is gone: network-status not written")
        self._patched_or_raise(namespace, name, status)

    def patch_pod_annotations_of(
        self, namespace: str, name: str, uid: str, annotations: dict[str, str]
    ) -> bool:
        """Like :meth:`patch_pod_annotations`, but only on the pod with ``uid``: False when there is
        no such pod (404, or another pod now has the name).

        The UID rides in the patch itself: kube-apiserver never lets an update change
        ``metadata.uid`` (422, naming that field), so the patch lands on that very pod or on none,
        in one request with the same RBAC ('patch' on pods/status) and no GET first. That is what
        a DEL needs: a StatefulSet recreates its pod under the same name, and the old sandbox's DEL
        must leave the new pod alone. An empty ``uid`` patches whichever pod has the name.
        """
        metadata: dict[str, Any] = {"annotations": annotations}
        if uid:
            metadata["uid"] = uid
        status, answer = self._patch_status(namespace, name, metadata)
        if status == 404 or (status == 422 and uid and "metadata.uid" in _invalid_fields(answer)):
            return False
        self._patched_or_raise(namespace, name, status)
        return True

    def _patch_status(self, namespace: str, name: str, metadata: dict[str, Any]) -> tuple[int, bytes]:
        path = f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(name)}/status"
        body = json.dumps({"metadata": metadata}).encode()
        return self._call("PATCH", path, body, "application/merge-patch+json")

    @staticmethod
    def _patched_or_raise(namespace: str, name: str, status: int) -> None:
        if status in (401, 403):
            raise CniError(
                KUBE_API_FAILURE,
                f"Kubernetes API refused PATCH pod {namespace}/{name}/status with {status}: "
                "grant the node's identity 'patch' on pods/status (conf/k8s/rdma-cni.yaml's ClusterRole)",
            )
        if status != 200:
            raise CniError(
                KUBE_API_FAILURE, f"Kubernetes API answered {status} to PATCH pod {namespace}/{name}/status"
            )

    def get_network_attachment_definition(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ``k8s.cni.cncf.io/v1`` NetworkAttachmentDefinition object; None when it does not exist."""
        path = (
            f"/apis/k8s.cni.cncf.io/v1/namespaces/{urllib.parse.quote(namespace)}"
            f"/network-attachment-definitions/{urllib.parse.quote(name)}"
        )
        return self._get_object(
            path,
            f"NetworkAttachmentDefinition {namespace}/{name}",
            "grant the node's identity 'get' on network-attachment-definitions (k8s.cni.cncf.io)",
        )

    def _get_object(self, path: str, what: str, rbac_fix: str, expected: str = "") -> dict[str, Any] | None:
        """GET one object: None on 404; refusals and other answers as errors naming ``what``
        (a non-object body: "something other than ``expected``")."""
        status, body = self._get(path)
        if status == 404:
            return None
        if status in (401, 403):
            raise CniError(KUBE_API_FAILURE, f"Kubernetes API refused GET {what} with {status}: {rbac_fix}")
        if status != 200:
            raise CniError(KUBE_API_FAILURE, f"Kubernetes API answered {status} to GET {what}")
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise CniError(KUBE_API_FAILURE, f"Kubernetes API sent invalid JSON for {what}") from exc
        if not isinstance(obj, dict):
            raise CniError(
                KUBE_API_FAILURE,
                f"Kubernetes API sent something other than {expected or f'an object for {what}'}",
            )
        return obj

    def _get(self, path: str) -> tuple[int, bytes]:
        return self._call("GET", path)

    def _call(
        self, method: str, path: str, body: bytes | None = None, content_type: str = ""
    ) -> tuple[int, bytes]:
        deadline = time.monotonic() + self.timeout
        last = ""
        for attempt in range(1, self.attempts + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                status, answer = self._timed_request(method, path, remaining, body, content_type)
            except (OSError, http.client.HTTPException) as exc:
                if isinstance(exc, ssl.SSLCertVerificationError):
                    raise CniError(
                        KUBE_API_FAILURE,
                        f"TLS verification of {self.config.server} failed ({exc.verify_message}): "
                        "fix the kubeconfig's certificate-authority",
                    ) from exc
                last = f"{type(exc).__name__}: {exc}"
            else:
                if status not in RETRYABLE_STATUS:
                    return status, answer
                last = f"HTTP {status}"
            # The last attempt's failure is in the error raised below, which the caller logs: a
            # warning here too would say it twice (a DEL with one attempt promises one line).
            log.log(
                logging.WARNING if attempt < self.attempts else logging.DEBUG,
                "Kubernetes API %s %s attempt %d/%d failed: %s", method, path, attempt, self.attempts, last,
            )  # fmt: skip
            pause = min(self.backoff * 2 ** (attempt - 1), max(0.0, deadline - time.monotonic()))
            if attempt < self.attempts and pause > 0:
                time.sleep(pause)
        raise CniError(
            KUBE_API_FAILURE,
            f"Kubernetes API {self.config.server} unreachable after {self.attempts} "
            f"attempt{'s' if self.attempts != 1 else ''} "
            f"within {self.timeout:g}s: {last or 'timed out'}",
        )

    def _timed_request(
        self, method: str, path: str, timeout: float, body: bytes | None, content_type: str
    ) -> tuple[int, bytes]:
        global _api_cpu_s
        cpu0 = time.thread_time()
        try:
            return self._request(method, path, timeout, body, content_type)
        finally:
            _api_cpu_s += time.thread_time() - cpu0

    def _watch(self, path: str, idle_timeout: float) -> EventStream:
        """Open the watch ``path`` (its query has ``watch=1``): connected within the client's
        ``timeout``, then each read may wait ``idle_timeout`` (longer than the server's
        ``timeoutSeconds``: a server that went silent without closing is a lost stream, not a hang).
        Raises :class:`WatchRefused` for any answer but 200, :class:`CniError` when unreachable."""
        conn = self._connection(self.timeout)
        try:
            conn.request("GET", self._url_path(path), headers=self._headers(""))
            resp = conn.getresponse()
            if resp.status != 200:
                body = resp.read()
                raise WatchRefused(resp.status, _answer_text(f"Kubernetes API answered {resp.status} to the "
                                                              f"watch {path.split('?')[0]}", body))
            if conn.sock is not None:
                conn.sock.settimeout(idle_timeout)
                _keepalive(conn.sock)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise CniError(KUBE_API_FAILURE, f"Kubernetes API {self.config.server} watch failed: "
                                             f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return EventStream(conn, resp)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        url = urllib.parse.urlsplit(self.config.server)
        if url.scheme == "https":
            return http.client.HTTPSConnection(
                url.hostname or "", url.port or 443, timeout=timeout, context=self._context()
            )
        return http.client.HTTPConnection(url.hostname or "", url.port or 80, timeout=timeout)

    def _url_path(self, path: str) -> str:
        return urllib.parse.urlsplit(self.config.server).path.rstrip("/") + path

    def _headers(self, content_type: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self.USER_AGENT}
        if content_type:
            headers["Content-Type"] = content_type
        token = self.config.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _request(
        self, method: str, path: str, timeout: float, body: bytes | None, content_type: str
    ) -> tuple[int, bytes]:
        conn = self._connection(timeout)
        try:
            conn.request(method, self._url_path(path), body=body, headers=self._headers(content_type))
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = tls_context(self.config)
        return self._ssl


def _keepalive(sock: socket.socket) -> None:
    """TCP keepalive probes after 30 s of silence, as Go's dialer (and so client-go) sends: a watch
    whose peer vanished (a load balancer's failover, a NAT that forgot the flow) is then found lost
    within about a minute, not only when the read timeout ends, minutes later."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


def _answer_text(prefix: str, body: bytes) -> str:
    """``prefix``, and the ``message`` of the ``Status`` the server answered with, when it is one."""
    try:
        message = str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        message = ""
    return prefix + (f": {message}" if message else "")


def _invalid_fields(answer: bytes) -> set[str]:
    """The fields a 422 ``Status`` names (``details.causes[].field``); none when it is not one."""
    try:
        return {str(c["field"]) for c in json.loads(answer)["details"]["causes"] if "field" in c}
    except (ValueError, KeyError, TypeError):
        return set()


def tls_context(config: KubeConfig) -> ssl.SSLContext:
    """Trust only the kubeconfig's CA when it names one (and skip parsing the system store)."""
    cadata = (
        config.ca_data.decode("ascii", errors="replace") if config.ca_data and not config.insecure else None
    )
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=cadata)
    if config.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if config.cert_data and config.key_data:
        _load_client_pair(ctx, config.cert_data, config.key_data)
    return ctx


def _load_client_pair(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl only loads key pairs from paths: hand it memfds so the key never touches a disk."""
    fds = [os.memfd_create("kube-cert", os.MFD_CLOEXEC), os.memfd_create("kube-key", os.MFD_CLOEXEC)]
    try:
        os.write(fds[0], cert)
        os.write(fds[1], key)
        try:
            ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
        except ssl.SSLError as exc:
            raise CniError(
                INVALID_CONFIG, "kubeconfig client-certificate/client-key cannot be loaded as a PEM pair"
            ) from exc
    finally:
        for fd in fds:
            os.close(fd)
