"""Node diagnostics behind ``cni-tool doctor`` and ``cni-tool state``.

Each check reads the node (sysfs, netlink, the installed files, the plugin's state) and returns
:class:`~rdma_cni.doctor.findings.Finding` lines: what it saw, OK/WARN/FAIL, and the command that fixes
it. Nothing here changes the node.
"""
