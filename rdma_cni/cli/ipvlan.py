"""Entry point of ``rdma-ipvlan`` (shared mode): stdin and env in, the protocol's stdout and exit
code out. ``SPEC`` is what the dispatcher and the warm node agent need; its factory imports the
plugin lazily so VERSION and malformed requests never load pydantic.
"""

from __future__ import annotations

from collections.abc import Mapping

from rdma_cni.cli.plugin_main import serve
from rdma_cni.cni.plugin import Plugin, PluginSpec

ABOUT = (
    "rdma-ipvlan: gives the pod an IPVLAN (or macvlan) child of every bond, each with an address of "
    "its own from the bond's subnet (shared RDMA NIC mode)"
)


def _factory() -> Plugin:
    # Here, not at the top: the plugin and its mechanisms cost ~80 ms of a cold start (python
    # -X importtime), which VERSION, a malformed request and a call the agent answers never pay.
    from rdma_cni.plugins.ipvlan.plugin import IpvlanPlugin

    return IpvlanPlugin()


SPEC = PluginSpec(name="rdma-ipvlan", factory=_factory, about=ABOUT)


def run(env: Mapping[str, str], stdin: bytes) -> tuple[str, int]:
    """The whole plugin as a function (what tests and the agent call)."""
    # Here, not at the top: the executable imports this module on its warm path too, where the
    # protocol core (~11 ms, python -X importtime) is never needed.
    from rdma_cni.cni.dispatch import run as dispatch

    return dispatch(env, stdin, SPEC)


def main() -> None:
    serve(SPEC)


if __name__ == "__main__":
    main()
