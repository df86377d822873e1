"""The API calls of the DRA driver: read a ResourceClaim, read the Node, and keep the node's
ResourceSlices; on the project's stdlib client (:class:`rdma_cni.kube.client.PodClient`: TLS, token or
client certificate, deadline, bounded retries of outages), so the driver needs no Kubernetes library.

Every refusal is a :class:`~rdma_cni.cni.errors.CniError` (``KUBE_API_FAILURE``) whose text names the
object and, for 401/403, the RBAC to grant; 404 on a read is ``None``.

    api = ResourceClient(kubeconfig.load(path))
    claim = api.get_claim("default", "gpu-nic")          # the object, or None
    api.list_slices("node-a")                            # this driver's slices of that node
    items, rv = api.list_slices_at("node-a")             # and the resourceVersion to watch from
    for event in api.watch_slices("node-a", rv, 300):    # until the server ends the watch
        ...
"""

from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any

from rdma_cni import __version__
from rdma_cni.cni.errors import INVALID_CONFIG, KUBE_API_FAILURE, CniError
from rdma_cni.dra import names
from rdma_cni.kube.client import EventStream, PodClient, WatchRefused
from rdma_cni.kube.kubeconfig import KubeConfig

RESOURCE = "/apis/resource.k8s.io/v1"
RBAC = "conf/k8s/dra's ClusterRole"
# A watch's reads wait this much longer than the server's timeoutSeconds before the stream is taken
# as lost: kube-apiserver ends a watch at that timeout, give or take its own scheduling.
WATCH_GRACE_S = 30


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class ResourceClient(PodClient):
    """:class:`PodClient`'s transport, with the resource.k8s.io/v1 calls of a DRA driver."""

    USER_AGENT = f"rdma-dra-driver/{__version__}"

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_object(
            f"{RESOURCE}/namespaces/{_q(namespace)}/resourceclaims/{_q(name)}",
            f"ResourceClaim {namespace}/{name}",
            f"grant the driver's ServiceAccount 'get' on resourceclaims ({RBAC})",
        )

    def get_node(self, name: str) -> dict[str, Any] | None:
        return self._get_object(f"/api/v1/nodes/{_q(name)}", f"Node {name}",
                                f"grant the driver's ServiceAccount 'get' on nodes ({RBAC})")

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        """This driver's ResourceSlices of ``node`` (field selectors spec.nodeName and spec.driver)."""
        return self.list_slices_at(node)[0]

    def list_slices_at(self, node: str) -> tuple[list[dict[str, Any]], str]:
        """:meth:`list_slices` and the list's resourceVersion, which a watch starts from."""
        obj = self._get_object(f"{RESOURCE}/resourceslices?fieldSelector={_slice_selector(node)}",
                               f"ResourceSlices of node {node}",
                               f"grant the driver's ServiceAccount 'list' on resourceslices ({RBAC})")
        items = obj.get("items") if obj is not None else None
        rv = str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")
        return ([i for i in items if isinstance(i, dict)] if isinstance(items, list) else []), rv

    def watch_slices(self, node: str, resource_version: str, timeout_s: int) -> EventStream:
        """The changes to this driver's slices of ``node`` after ``resource_version``, with bookmarks,
        until the server ends the watch after ``timeout_s``. 410 (too old: list again) is a
        :class:`~rdma_cni.kube.client.WatchRefused` with ``status`` 410, as are the other refusals."""
        path = (f"{RESOURCE}/resourceslices?watch=1&fieldSelector={_slice_selector(node)}"
                f"&resourceVersion={_q(resource_version)}&allowWatchBookmarks=true&timeoutSeconds={timeout_s}")
        try:
            return self._watch(path, idle_timeout=timeout_s + WATCH_GRACE_S)
        except WatchRefused as e:
            if e.status in (401, 403):
                raise WatchRefused(e.status, f"Kubernetes API refused the watch of ResourceSlices of node "
                                             f"{node} with {e.status}: grant the driver's ServiceAccount "
                                             f"'watch' on resourceslices ({RBAC})") from e
            raise

    def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._write("POST", f"{RESOURCE}/resourceslices", obj, (201, 200))

    def update_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        return self._write("PUT", f"{RESOURCE}/resourceslices/{_q(name)}", obj, (200,))

    def delete_slice(self, name: str) -> dict[str, Any]:
        """Delete the slice; the server's answer when it is the deleted object (its resourceVersion is
        the deletion's), else {} (gone already, or a ``Status``)."""
        status, body = self._call("DELETE", f"{RESOURCE}/resourceslices/{_q(name)}")
        if status not in (200, 202, 404):
            raise CniError(KUBE_API_FAILURE, _refusal("DELETE", f"ResourceSlice {name}", status, "delete"))
        try:
            answer = json.loads(body)
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) and answer.get("kind") == "ResourceSlice" else {}

    def _write(self, method: str, path: str, obj: dict[str, Any], ok: tuple[int, ...]) -> dict[str, Any]:
        name = obj.get("metadata", {}).get("name", "")
        status, body = self._call(method, path, json.dumps(obj).encode(), "application/json")
        if status not in ok:
            verb = "create" if method == "POST" else "update"
            raise CniError(KUBE_API_FAILURE, _refusal(method, f"ResourceSlice {name}", status, verb, body))
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise CniError(KUBE_API_FAILURE, f"Kubernetes API sent invalid JSON for ResourceSlice {name}") \
                from exc
        return answer if isinstance(answer, dict) else {}


def _slice_selector(node: str) -> str:
    return _q(f"spec.nodeName={node},spec.driver={names.DRIVER}")


def _refusal(method: str, what: str, status: int, verb: str, body: bytes = b"") -> str:
    if status in (401, 403):
        return (f"Kubernetes API refused {method} {what} with {status}: grant the driver's ServiceAccount "
                f"'{verb}' on resourceslices of its own node ({RBAC})")
    message = ""
    try:
        message = str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        pass
    return f"Kubernetes API answered {status} to {method} {what}" + (f": {message}" if message else "")


SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def in_cluster(env: dict[str, str], account_dir: str = SERVICE_ACCOUNT) -> KubeConfig:
    """The pod's own ServiceAccount, as client-go's rest.InClusterConfig reads it: the API server from
    KUBERNETES_SERVICE_HOST/PORT, the CA and the (rotating, so re-read per request) token from the
    mounted account directory."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise CniError(INVALID_CONFIG, "not in a pod (KUBERNETES_SERVICE_HOST/PORT unset): give --kubeconfig")
    try:
        with open(os.path.join(account_dir, "ca.crt"), "rb") as f:
            ca = f.read()
    except OSError as exc:
        raise CniError(INVALID_CONFIG, f"cannot read the ServiceAccount CA in {account_dir} "
                       f"({exc.strerror}): mount the ServiceAccount token or give --kubeconfig") from exc
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return KubeConfig(path="in-cluster", server=server, ca_data=ca,
                      token_file=os.path.join(account_dir, "token"))
