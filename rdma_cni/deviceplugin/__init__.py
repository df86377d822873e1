"""The kubelet device plugin for ``tke.cloud.tencent.com/tke-shared-rdma``.

Two rooms, as in NVIDIA's plugin: the device model (``config``, ``model``, ``inventory``, ``health``,
``allocation``) decides what the devices are, whether each is healthy and what a container gets,
as functions of sysfs, the dev root, netlink of the current netns and rdma-macvlan's state; the gRPC
layer (``server``, ``registration``, ``watch``, ``status``) carries those answers to kubelet.
"""
