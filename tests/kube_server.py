"""A loopback Kubernetes API server for tests: real TLS, real Pod JSON, real auth failures.

It serves ``GET /api/v1/namespaces/{ns}/pods/{name}`` like kube-apiserver: the Pod object (kind,
apiVersion, metadata with uid and annotations, spec.containers[].resources), a ``Status`` object with
404 for a missing pod and 401 without valid credentials. It also takes a JSON merge patch of a pod's
``status`` subresource (``PATCH .../pods/{name}/status``, content type
``application/merge-patch+json``, else 415) applied to the stored pod (a ``metadata.uid`` other than
the pod's is refused with 422, as kube-apiserver keeps uid immutable), and serves
``GET /apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions/{name}``. ``forbid``
holds verbs (``"patch"``, ``"get"``) answered 403, as missing RBAC would. Credentials are a bearer
token or a client certificate signed by the test CA (what kubeadm's node kubeconfigs use). Tests can
script failures: ``fail_next`` statuses (e.g. 500) answered before the real answer, and ``delay``
seconds per answer.

Certificates are generated with the ``openssl`` CLI into a temp dir per :class:`Pki`. The server can
listen inside a network namespace (``netns=``), so a plugin run with ``ip netns exec`` reaches it
on that namespace's loopback.

    with Pki(tmp) as pki, KubeServer(pki) as api:
        api.add_pod("default", "p1", uid="u1", annotations={...})
        kubeconfig = api.kubeconfig(tmp / "kc", auth="token")
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

CLONE_NEWNET = 0x40000000


class Pki:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, as PEM files."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_cert = self.dir / "ca.crt"
        self.ca_key = self.dir / "ca.key"
        self.server_cert = self.dir / "server.crt"
        self.server_key = self.dir / "server.key"
        self.client_cert = self.dir / "client.crt"
        self.client_key = self.dir / "client.key"
        self._make()

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.dir)

    def _make(self) -> None:
        self._openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(self.ca_key), "-out", str(self.ca_cert), "-days", "2", "-subj", "/CN=h5-test-ca",
        )  # fmt: skip
        self._leaf("server", "/CN=kube-apiserver", "subjectAltName=IP:127.0.0.1,DNS:localhost")
        self._leaf("client", "/O=system:nodes/CN=system:node:h5-node", "extendedKeyUsage=clientAuth")

    def _leaf(self, name: str, subject: str, ext: str) -> None:
        key, csr, crt = self.dir / f"{name}.key", self.dir / f"{name}.csr", self.dir / f"{name}.crt"
        self._openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", subject,
        )  # fmt: skip
        extfile = self.dir / f"{name}.ext"
        extfile.write_text(ext + "\n")
        self._openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert), "-CAkey", str(self.ca_key),
            "-CAcreateserial", "-out", str(crt), "-days", "2", "-extfile", str(extfile),
        )  # fmt: skip


@contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the block with this thread in netns ``name`` (sockets made here stay in it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
        try:
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(own)
        os.close(target)


class KubeServer:
    def __init__(self, pki: Pki, netns: str | None = None) -> None:
        self.pki = pki
        self.netns = netns
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.tokens: set[str] = {"h5-token-" + uuid.uuid4().hex}
        self.fail_next: list[int] = []
        self.delay = 0.0
        self.requests: list[dict[str, Any]] = []
        self.nads: dict[tuple[str, str], dict[str, Any]] = {}
        self.forbid: set[str] = set()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def token(self) -> str:
        return next(iter(self.tokens))

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"https://127.0.0.1:{self._httpd.server_address[1]}"

    def add_pod(
        self,
        namespace: str,
        name: str,
        uid: str | None = None,
        annotations: dict[str, str] | None = None,
        limits: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A Pod object shaped like kube-apiserver's answer."""
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid or str(uuid.uuid4()),
                "resourceVersion": "4242",
                "creationTimestamp": "2026-11-29T23:00:00Z",
                "labels": {"k8s-app": "ibv-app"},
                "annotations": annotations or {},
            },
            "spec": {
                "nodeName": "h5-node",
                "containers": [
                    {
                        "name": "ibv-app-ctr",
                        "image": "mofed:test",
                        "resources": {"limits": limits or {}, "requests": dict(limits or {})},
                        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                    }
                ],
            },
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        self.pods[(namespace, name)] = pod
        return pod

    def add_nad(
        self, namespace: str, name: str, config: str, annotations: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """A NetworkAttachmentDefinition object; ``config`` is spec.config's text, taken as given."""
        nad = {
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                         "annotations": annotations or {}},
            "spec": {"config": config},
        }  # fmt: skip
        self.nads[(namespace, name)] = nad
        return nad

    def kubeconfig(self, path: Path, auth: str = "token", inline: bool = True) -> Path:
        """Write a kubeconfig like kubeadm's: YAML, CA and client pair inline (``-data``) or as files."""

        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        if inline:
            ca = f"    certificate-authority-data: {b64(self.pki.ca_cert)}"
        else:
            ca = f"    certificate-authority: {self.pki.ca_cert}"
        if auth == "token":
            user = f"    token: {self.token}"
        elif auth == "tokenFile":
            token_file = path.parent / "token"
            token_file.write_text(self.token + "\n")
            user = "    tokenFile: token"
        elif inline:
            user = (
                f"    client-certificate-data: {b64(self.pki.client_cert)}\n"
                f"    client-key-data: {b64(self.pki.client_key)}"
            )
        else:
            user = f"    client-certificate: {self.pki.client_cert}\n    client-key: {self.pki.client_key}"
        path.write_text(
            "apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            "- cluster:\n"
            f"{ca}\n"
            f"    server: {self.url}\n"
            "  name: h5-cluster\n"
            "contexts:\n"
            "- context:\n"
            "    cluster: h5-cluster\n"
            "    user: h5-node  # the node's identity\n"
            "  name: h5-ctx\n"
            "current-context: h5-ctx\n"
            "preferences: {}\n"
            "users:\n"
            "- name: h5-node\n"
            "  user:\n"
            f"{user}\n"
        )
        return path

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.pki.server_cert), str(self.pki.server_key))
        ctx.load_verify_locations(str(self.pki.ca_cert))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        handler = _handler_for(self)
        if self.netns:
            with in_netns(self.netns):
                httpd = _TlsServer(("127.0.0.1", 0), handler, ctx)
        else:
            httpd = _TlsServer(("127.0.0.1", 0), handler, ctx)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _answer(
        self,
        path: str,
        headers: dict[str, str],
        peer_cert: dict[str, Any] | None,
        method: str = "GET",
        body: bytes = b"",
    ) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(
                {"method": method, "path": path, "authorization": "Authorization" in headers, "body": body,
                 "user-agent": headers.get("User-Agent", "")}
            )
            scripted = self.fail_next.pop(0) if self.fail_next else None
        if self.delay:
            time.sleep(self.delay)
        if scripted is not None:
            return scripted, _status(scripted, "scripted failure")
        auth = headers.get("Authorization", "")
        token_ok = auth.startswith("Bearer ") and auth[len("Bearer ") :] in self.tokens
        if not token_ok and not peer_cert:
            return 401, _status(401, "Unauthorized")
        if method.lower() in self.forbid:
            return 403, _status(403, f"forbidden: cannot {method.lower()} {path}")
        parts = path.strip("/").split("/")
        if method == "PATCH":
            return self._patch_status(parts, headers, body)
        if len(parts) == 7 and parts[:4] == ["apis", "k8s.cni.cncf.io", "v1", "namespaces"]:
            if parts[5] == "network-attachment-definitions":
                nad = self.nads.get((parts[4], parts[6]))
                if nad is None:
                    return 404, _status(
                        404, f'network-attachment-definitions.k8s.cni.cncf.io "{parts[6]}" not found'
                    )
                return 200, nad
        if len(parts) != 6 or parts[:3] != ["api", "v1", "namespaces"] or parts[4] != "pods":
            return 404, _status(404, "the server could not find the requested resource")
        pod = self.pods.get((parts[3], parts[5]))
        if pod is None:
            return 404, _status(404, f'pods "{parts[5]}" not found')
        return 200, pod

    def _patch_status(self, parts: list[str], headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        if (
            len(parts) != 7
            or parts[:3] != ["api", "v1", "namespaces"]
            or parts[4] != "pods"
            or parts[6] != "status"
        ):
            return 405, _status(405, "the server does not allow this method on the requested resource")
        if headers.get("Content-Type") != "application/merge-patch+json":
            return 415, _status(
                415, f"the body of the request was in an unknown format: {headers.get('Content-Type')}"
            )
        try:
            patch = json.loads(body)
        except ValueError:
            return 400, _status(400, "invalid JSON in the patch")
        with self._lock:
            pod = self.pods.get((parts[3], parts[5]))
            if pod is None:
                return 404, _status(404, f'pods "{parts[5]}" not found')
            uid = (patch.get("metadata") or {}).get("uid")
            if uid is not None and uid != pod["metadata"]["uid"]:
                return 422, _uid_immutable(parts[5], uid)
            _merge_patch(pod, patch)
            return 200, pod


def _merge_patch(target: dict[str, Any], patch: Any) -> None:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_patch(target[key], value)
        else:
            target[key] = value


def _uid_immutable(name: str, uid: str) -> dict[str, Any]:
    """kube-apiserver's 422 for an update that would change a pod's ``metadata.uid``."""
    cause = {"reason": "FieldValueInvalid", "field": "metadata.uid",
             "message": f'Invalid value: "{uid}": field is immutable'}  # fmt: skip
    return {**_status(422, f'Pod "{name}" is invalid: metadata.uid: field is immutable'),
            "reason": "Invalid", "details": {"name": name, "kind": "pods", "causes": [cause]}}  # fmt: skip


def _status(code: int, message: str) -> dict[str, Any]:
    reason = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 500: "InternalError"}.get(
        code, "Unknown"
    )
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


class _TlsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], ctx: ssl.SSLContext
    ) -> None:
        self.ctx = ctx
        super().__init__(addr, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that rejects our certificate (a test of CA checking) is not a server error."""

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        return self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr


def _handler_for(server: KubeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def _serve(self, method: str) -> None:
            assert isinstance(self.connection, ssl.SSLSocket)
            peer = self.connection.getpeercert() or None
            length = int(self.headers.get("Content-Length") or 0)
            payload = self.rfile.read(length) if length else b""
            self._reply(*server._answer(self.path, dict(self.headers), peer, method, payload))

        def _reply(self, status: int, body: Any) -> None:
            """One JSON answer; a server with streamed answers (tests/dra_api.py) overrides this."""
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler
