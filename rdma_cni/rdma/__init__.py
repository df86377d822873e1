"""RDMA mechanisms: devices, ports and GID tables from sysfs, the nldev netlink family, netns mode.

Everything here reads under a ``sysfs_root`` (``/sys`` on a node, a captured or simulated tree in
tests) so the same code runs against the real kernel and against ``rdma_cni.sim``.
"""
