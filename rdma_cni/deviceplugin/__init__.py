"""The kubelet device plugin for ``tke.cloud.tencent.com/tke-shared-rdma`` and any other pools.

Two rooms, as in NVIDIA's plugin: the device model (``config``, ``poolconf``, ``model``, ``inventory``,
``hca``, ``selectors``, ``pools``, ``health``, ``allocation``, ``shared``) decides which pools exist,
what each one's devices are, whether each is healthy and what a container gets, as functions of
sysfs, the dev root, netlink of the current netns and rdma-macvlan's state; the gRPC layer
(``server``, ``registration``, ``watch``, ``status``, ``daemon``) carries those answers to kubelet,
one socket and one registration per pool.
"""
