"""Entry point of ``rdma-multus``: stdin and env in, the protocol's stdout and exit code out."""

from __future__ import annotations

import os
import sys

from rdma_cni.cni.plugin import Plugin, PluginSpec

ABOUT = "rdma-multus: runs the networks a pod's tke.cloud.tencent.com/networks annotation names"


def _factory() -> Plugin:
    # Imported here so that VERSION and malformed requests never pay for the plugin's imports.
    from rdma_cni.plugins.multus import Multus

    return Multus()


SPEC = PluginSpec(name="rdma-multus", factory=_factory, about=ABOUT)


def main() -> None:
    from rdma_cni.agent.client import try_agent  # warm path first: stdlib only

    if (answer := try_agent(SPEC.name)) is not None:
        sys.exit(answer)
    from rdma_cni.cni.dispatch import run

    env = dict(os.environ)
    stdin = sys.stdin.buffer.read() if env.get("CNI_COMMAND") else b""
    stdout, code = run(env, stdin, SPEC)
    if stdout:
        sys.stdout.write(stdout)
        sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
