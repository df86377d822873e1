"""Entry point of ``rdma-macvlan``: stdin and env in, the protocol's stdout and exit code out.

``SPEC`` is what the dispatcher (and the warm node agent) needs; its factory imports the plugin
lazily so VERSION and malformed requests never load pyroute2 or pydantic.
"""

from __future__ import annotations

from collections.abc import Mapping

from rdma_cni.cli.plugin_main import serve
from rdma_cni.cni.plugin import Plugin, PluginSpec

ABOUT = "rdma-macvlan: moves a bond's IP (and its RDMA GID) into the pod on a macvlan, and gives it back"


def _factory() -> Plugin:
    # Here, not at the top: the plugin and its mechanisms cost ~110 ms of a cold start (python
    # -X importtime), which VERSION, a malformed request and a call the agent answers never pay.
    from rdma_cni.plugins.macvlan.plugin import MacvlanPlugin

    return MacvlanPlugin()


SPEC = PluginSpec(name="rdma-macvlan", factory=_factory, known_args=frozenset({"MAC"}), about=ABOUT)


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
