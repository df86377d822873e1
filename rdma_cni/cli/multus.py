"""Entry point of ``rdma-multus``: stdin and env in, the protocol's stdout and exit code out."""

from __future__ import annotations

from rdma_cni.cni.plugin import Plugin, PluginSpec

ABOUT = "rdma-multus: runs the networks a pod's tke.cloud.tencent.com/networks annotation names"


def _factory() -> Plugin:
    # Imported here so that VERSION and malformed requests never pay for the plugin's imports.
    from rdma_cni.plugins.multus.plugin import Multus

    return Multus()


SPEC = PluginSpec(name="rdma-multus", factory=_factory, about=ABOUT)


def main() -> None:
    from rdma_cni.cli.plugin_main import serve

    serve(SPEC)


if __name__ == "__main__":
    main()
