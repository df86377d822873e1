"""Entry point of ``rdma-multus``: stdin and env in, the protocol's stdout and exit code out."""

from __future__ import annotations

from rdma_cni.cli.plugin_main import serve
from rdma_cni.cni.plugin import Plugin, PluginSpec

ABOUT = "rdma-multus: runs the networks a pod's tke.cloud.tencent.com/networks annotation names"


def _factory() -> Plugin:
    # Here, not at the top: the plugin and its mechanisms cost ~65 ms of a cold start (python
    # -X importtime), which VERSION, a malformed request and a call the agent answers never pay.
    from rdma_cni.plugins.multus.plugin import Multus

    return Multus()


SPEC = PluginSpec(name="rdma-multus", factory=_factory, about=ABOUT)


def main() -> None:
    serve(SPEC)


if __name__ == "__main__":
    main()
