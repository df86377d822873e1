"""The DRA kubelet plugin for driver ``rdma.tke.cloud.tencent.com``: the second front end on the device
model (:mod:`rdma_cni.devices`), beside the device plugin, as dranet's ``pkg/driver`` sits on its
``pkg/inventory``.

- :mod:`.names`: every name the API sees (driver, attributes, taint, limits), once;
- :mod:`.table`: the driver's devices, made from one scan in the config's form (the bonds of
  ``masters``; or every member of every pool of ``pools:`` / Mellanox's ``config.json``), named once
  for the slices, the health stream and prepare alike (pure);
- :mod:`.watch`: the device plugin's scan again on every link event and rescan tick, the table
  republished when it changed;
- :mod:`.slices`: the ResourceSlice specs of one table (pure);
- :mod:`.claims`: which devices of a ResourceClaim are ours (pure);
- :mod:`.prepared`: the durable record of each prepared claim (write-ahead, rename);
- :mod:`.driver`: NodePrepareResources / NodeUnprepareResources on the model, CDI specs out;
- :mod:`.service`: kubelet's gRPC services (DRA v1 and v1beta1, plugin registration);
- :mod:`.health`: kubelet's device health stream (DRAResourceHealth v1 and v1alpha1);
- :mod:`.kubeapi`, :mod:`.publish`: ResourceClaims in, ResourceSlices out, through the API server;
- :mod:`.daemon`: the process (scan, serve, register, publish on every change).

The network stays the CNI's: prepare only hands the container its device nodes and env (CDI).

Why not PyPI's ``kubernetes-pydra`` (0.1.0, 2026-06, read as a precedent): one release; it serves
only ``v1.DRAPlugin`` (kubelets before 1.34 speak v1beta1 only), parses the pool and device back out
of CDI IDs, keeps no record of prepared claims (a retry after a crash re-runs everything blind), and
needs the ``kubernetes`` client package (a runtime dependency this project does not have). The
protos here are kubelet's own files (``rdma_cni/proto``, scripts/gen-proto) and the API calls go
through the project's stdlib client.
"""
