"""What rdma-multus knows about the pod being wired: its network request and its devices.

Sources, cheapest first: containerd passes every pod annotation in
``runtimeConfig["io.kubernetes.cri.pod-annotations"]``, so no API call is needed then; otherwise the
pod is fetched once (lazily) from the API server. Device IDs come from the kubelet's device checkpoint,
keyed by the pod UID (``K8S_POD_UID`` from the runtime, else the API's). A pod fetched from the API
whose UID differs from ``K8S_POD_UID`` is a different pod with the same name: refused.
"""

from __future__ import annotations

import logging

from rdma_cni.cni.errors import KUBE_API_FAILURE, CniError
from rdma_cni.cni.request import Request
from rdma_cni.kube.pod import Pod
from rdma_cni.plugins.multus_config import MultusConfig
from rdma_cni.plugins.multus_networks import NetworkSelection, parse_annotation

log = logging.getLogger("rdma_cni.multus")

CRI_ANNOTATIONS = "io.kubernetes.cri.pod-annotations"


class PodView:
    def __init__(self, req: Request, cfg: MultusConfig) -> None:
        self.cfg = cfg
        self.namespace = req.args.get("K8S_POD_NAMESPACE", "")
        self.name = req.args.get("K8S_POD_NAME", "")
        self.uid = req.args.get("K8S_POD_UID", "")
        annotations = req.runtime_config.get(CRI_ANNOTATIONS)
        self._runtime_annotations = annotations if isinstance(annotations, dict) else None
        self._pod: Pod | None = None
        self._fetched = False

    def ref(self) -> dict[str, str]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}

    def selections(self) -> list[NetworkSelection]:
        if self._runtime_annotations is not None:
            text = self._runtime_annotations.get(self.cfg.annotation, "")
            source = "runtime"
        else:
            pod = self.pod()
            text = pod.annotations.get(self.cfg.annotation, "") if pod else ""
            source = "API" if pod else "none"
        if not isinstance(text, str):
            raise CniError(KUBE_API_FAILURE, f"pod annotation {self.cfg.annotation} is not a string")
        log.info("pod %s/%s %s=%r (from %s)", self.namespace, self.name, self.cfg.annotation, text, source)
        return parse_annotation(text, self.cfg.annotation)

    def device_ids(self, resource: str) -> list[str]:
        uid = self.uid
        if not uid and self._runtime_annotations is None:
            pod = self.pod()
            uid = pod.uid if pod else ""
        if not uid or not resource:
            return []
        from rdma_cni.kube.checkpoint import device_ids

        return device_ids(self.cfg.kubelet_root_dir, uid, resource)

    def requested(self, resource: str) -> int:
        """The pod's requested count of ``resource``; 0 when unknown.

        When the runtime handed us the annotations, the API is only asked for this count, and an
        API that cannot answer must not fail a pod that would otherwise start: the delegate then
        uses its own ``count``.
        """
        try:
            pod = self.pod()
        except CniError as err:
            if self._runtime_annotations is None:
                raise
            log.warning("pod %s/%s: requested %s unknown: %s", self.namespace, self.name, resource, err.msg)
            return 0
        return pod.requests.get(resource, 0) if pod else 0

    def pod(self) -> Pod | None:
        """The pod from the API server, fetched at most once; None when there is no way to ask."""
        if self._fetched:
            return self._pod
        self._fetched = True
        if not self.cfg.kubeconfig or not self.name or not self.namespace:
            return None
        from rdma_cni.kube import kubeconfig
        from rdma_cni.kube.client import PodClient

        client = PodClient(
            kubeconfig.load(self.cfg.kubeconfig), timeout=self.cfg.api_timeout, attempts=self.cfg.api_attempts
        )
        pod = client.get_pod(self.namespace, self.name)
        if pod is None:
            raise CniError(
                KUBE_API_FAILURE, f"pod {self.namespace}/{self.name} not found in the Kubernetes API"
            )
        if self.uid and pod.uid != self.uid:
            raise CniError(
                KUBE_API_FAILURE,
                f"pod {self.namespace}/{self.name} in the API has UID {pod.uid}, the runtime asked for "
                f"{self.uid}: the pod was recreated; the runtime will retry with the new one",
            )
        self._pod = pod
        return pod
