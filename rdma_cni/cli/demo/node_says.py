"""Step 6 of the demo: what the node says. ``cni-tool state`` (who holds which bond and address) and
``cni-tool doctor`` (every check of the node), run in the node netns on the demo's directories."""

from __future__ import annotations

from rdma_cni.cli.demo.installed import Demo
from rdma_cni.cli.demo.shell import banner


def show(d: Demo, options: list[str]) -> None:
    """``options``: where the node's files are (:meth:`.node.Demo.node_options`, and more in shared mode)."""
    banner("6. What the node says: cni-tool state and cni-tool doctor")
    d.cni_tool("state", *options, check=False)
    d.cni_tool("doctor", *options, check=False)
