"""The kubelet device plugin for ``tke.cloud.tencent.com/tke-shared-rdma`` and any other pools: a
front end on the device model (:mod:`rdma_cni.devices`), which decides which pools exist, what each
one's devices are, whether each is healthy and what a container gets.

What is the device-plugin API's stays here, as in NVIDIA's plugin: the gRPC service (``server``:
ListAndWatch, GetPreferredAllocation, Allocate), serving, proving and registering one socket per
pool and starting over when kubelet forgets us (``registration``), the rescan that pushes health
changes (``watch``), the status file (``status``) and the process (``daemon``).
"""
