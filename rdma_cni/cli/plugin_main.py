"""The process side of every CNI plugin executable: warm agent first, else the pure core in-process.

Stdin is read only when CNI_COMMAND is set (a person running the binary by hand gets the about text
instead of a hanging read); stdout carries only the protocol answer.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from rdma_cni.agent.client import try_agent
from rdma_cni.cni.plugin import PluginSpec


def serve(spec: PluginSpec) -> NoReturn:
    if (answer := try_agent(spec.name)) is not None:  # warm path first: the client is stdlib only
        sys.exit(answer)
    # Here, not at the top: the protocol core costs ~11 ms (python -X importtime) that a call the
    # agent answered never pays.
    from rdma_cni.cni.dispatch import run

    env = dict(os.environ)
    stdin = sys.stdin.buffer.read() if env.get("CNI_COMMAND") else b""
    stdout, code = run(env, stdin, spec)
    if stdout:
        sys.stdout.write(stdout)
        sys.stdout.flush()
    sys.exit(code)
