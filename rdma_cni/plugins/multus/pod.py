"""What rdma-multus knows about the pod being wired: its network request and its devices.

Sources, cheapest first: containerd passes every pod annotation in
``runtimeConfig["io.kubernetes.cri.pod-annotations"]``, so no API call is needed then; otherwise the
pod is fetched once (lazily) from the API server. A pod fetched from the API whose UID differs from
``K8S_POD_UID`` is a different pod with the same name: refused.

Device IDs come from kubelet's PodResources API (by namespace/name: what kubelet allocated, so the
bonds the pod gets are exactly the RDMA devices mounted in it); when its socket is absent or kubelet
cannot answer, from kubelet's device checkpoint, keyed by the pod UID (``K8S_POD_UID`` from the
runtime, else the API's). Asked at most once per call, and only when a network names a resource or
the pod's networks could not be read.

The same answer carries the pod's DRA devices (its claims', and the extended-resource claim's:
:mod:`rdma_cni.kube.podresources`); those of our driver are the bonds the claims hold
(:mod:`.claims`). Without PodResources they come from kubelet's DRA checkpoint
(:mod:`rdma_cni.kube.dra_checkpoint`) by pod UID; without either, a DRA pod's devices are unknown:
an unreadable DRA checkpoint fails the ADD naming the fix, and a node with neither (no DRA
checkpoint: a kubelet without DRA) has no claims to give.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rdma_cni.cni.errors import KUBE_API_FAILURE, CniError
from rdma_cni.cni.request import Request
from rdma_cni.devices.dra_names import DRIVER
from rdma_cni.kube.checkpoint import pod_devices
from rdma_cni.kube.pod import Pod
from rdma_cni.plugins.multus.config import MultusConfig
from rdma_cni.plugins.multus.networks import NetworkSelection, parse_annotation

if TYPE_CHECKING:
    from rdma_cni.kube.client import PodClient
    from rdma_cni.kube.podresources import ClaimDevice, PodAllocation

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
        self._api: PodClient | None = None
        self._allocation: PodAllocation | None = None
        self.annotation_read = False  # set by selections(): False when neither runtime nor API had it

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
        self.annotation_read = source != "none"
        if not isinstance(text, str):
            raise CniError(KUBE_API_FAILURE, f"pod annotation {self.cfg.annotation} is not a string")
        log.info("pod %s/%s %s=%r (from %s)", self.namespace, self.name, self.cfg.annotation, text, source)
        return parse_annotation(text, self.cfg.annotation)

    def device_ids(self, resource: str) -> list[str]:
        return list(self.devices().get(resource, [])) if resource else []

    def devices(self) -> dict[str, list[str]]:
        """Resource -> the device IDs kubelet allocated to this pod (PodResources, else checkpoint)."""
        return self._allocated().devices

    def claim_devices(self) -> list[ClaimDevice]:
        """The devices of our DRA driver in the pod's claims (PodResources, else kubelet's DRA
        checkpoint), each once; other drivers' devices are left out."""
        return [c for c in self._allocated().claims if c.driver == DRIVER]

    def _allocated(self) -> PodAllocation:
        if self._allocation is None:
            found = self._from_pod_resources()
            self._allocation = found if found is not None else self._from_checkpoints()
        return self._allocation

    def checkpoint_devices(self) -> dict[str, list[str]]:
        """The checkpoint's view only: a file read, no gRPC (for a warning on pods without RDMA)."""
        return self._allocation.devices if self._allocation is not None else self._from_checkpoint()

    def checkpoint_claim_devices(self) -> list[ClaimDevice]:
        """Our driver's devices by the DRA checkpoint only, for the same warnings: what is already
        known, else a file read; a checkpoint that cannot be read warns nobody (debug log)."""
        if self._allocation is not None:
            return self.claim_devices()
        uid = self._pod_uid()
        if not uid:
            return []
        from rdma_cni.kube import dra_checkpoint  # see _from_checkpoints

        try:
            found = dra_checkpoint.pod_claim_devices(self.cfg.kubelet_root_dir, uid)
        except CniError as err:
            log.debug("%s", err.msg)
            return []
        return [c for c in found if c.driver == DRIVER]

    def _from_pod_resources(self) -> PodAllocation | None:
        if not self.namespace or not self.name:
            return None
        # Here, not at the top: rdma_cni.kube.podresources costs ~4.5 ms of a cold multus call
        # (python -X importtime), and a call with no pod name never asks kubelet.
        from rdma_cni.kube import podresources

        sock = podresources.socket_path(self.cfg.pod_resources_dir)
        if not podresources.available(sock):
            log.info("no kubelet PodResources socket at %s: reading the device checkpoint", sock)
            return None
        try:
            timeout = self.cfg.pod_resources_timeout
            found = podresources.pod_allocation(sock, self.namespace, self.name, timeout)
        except CniError as err:
            log.warning("%s; reading the device checkpoint instead", err.msg)
            return None
        if found is None:
            log.warning("kubelet PodResources does not know pod %s/%s: reading the device checkpoint",
                        self.namespace, self.name)  # fmt: skip
            return None
        dra = f", DRA {[(c.driver, c.device) for c in found.claims]}" if found.claims else ""
        log.info("pod %s/%s devices from kubelet PodResources: %s%s", self.namespace, self.name,
                 found.devices, dra)  # fmt: skip
        return found

    def _from_checkpoints(self) -> PodAllocation:
        """Both of kubelet's checkpoints: device-plugin devices and DRA claims, by pod UID."""
        # Here, not at the top: the DRA checkpoint reader costs ~0.5 ms of a cold multus call and
        # the PodResources types it reads into ~6 ms (python -X importtime), paid only by a call
        # that needs the pod's devices or warns about them.
        from rdma_cni.kube import dra_checkpoint
        from rdma_cni.kube.podresources import PodAllocation

        uid = self._pod_uid()
        claims = dra_checkpoint.pod_claim_devices(self.cfg.kubelet_root_dir, uid) if uid else []
        if claims:
            log.info("pod %s/%s DRA devices from kubelet's DRA checkpoint: %s", self.namespace, self.name,
                     [(c.driver, c.device) for c in claims])  # fmt: skip
        return PodAllocation(self._from_checkpoint(), tuple(claims))

    def _from_checkpoint(self) -> dict[str, list[str]]:
        uid = self._pod_uid()
        if not uid:
            return {}
        return pod_devices(self.cfg.device_plugin_dir, uid)

    def _pod_uid(self) -> str:
        """``K8S_POD_UID``, else the API's (asked only when the runtime passed no annotations)."""
        uid = self.uid
        if not uid and self._runtime_annotations is None:
            pod = self.pod()
            uid = pod.uid if pod else ""
        return uid

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

    def api(self) -> PodClient:
        """The API client of this call, built once: the pod GET, NetworkAttachmentDefinition GETs
        and the network-status PATCH share its kubeconfig read and TLS context."""
        if self._api is None:
            # Here, not at the top: the API client and the kubeconfig reader (http.client, ssl,
            # yaml) cost ~80 ms of a cold multus call (python -X importtime), which a call whose
            # runtime handed over the pod's annotations never pays.
            from rdma_cni.kube import kubeconfig
            from rdma_cni.kube.client import PodClient

            self._api = PodClient(
                kubeconfig.load(self.cfg.kubeconfig),
                timeout=self.cfg.api_timeout,
                attempts=self.cfg.api_attempts,
            )
        return self._api

    def pod(self) -> Pod | None:
        """The pod from the API server, fetched at most once; None when there is no way to ask."""
        if self._fetched:
            return self._pod
        self._fetched = True
        if not self.cfg.kubeconfig or not self.name or not self.namespace:
            return None
        pod = self.api().get_pod(self.namespace, self.name)
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
