"""The test kubelet's PodResources server, for the tests that import it from here: it lives in
:mod:`rdma_cni.sim.podresources` beside the simulated kubelet, so the demo serves the same API.
``claim``/``device`` build the DRA claims a container reports (``dynamic_resources``)."""

from rdma_cni.sim.podresources import GET_DISABLED, SERVICE, PodResourcesServer, claim, device

__all__ = ["GET_DISABLED", "SERVICE", "PodResourcesServer", "claim", "device"]
