"""The previous version's code, for the compatibility tests: the ``rdma_cni`` package (and its C
client source) of a commit, unpacked from git history with ``git archive`` (no worktree, no
checkout: the shared working tree is never touched), and the environment that makes a Python
process import it instead of this checkout's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The last commit before the compatibility policy: the records in tests/core/fixtures/records-schema1
# come from it, and its thin client and agent speak wire version 1 (no version offer).
PREVIOUS = "df84435d7f58433589beaf9bbdb9f32ba0ea272f"


def env(code: str) -> dict[str, str]:
    """PYTHONSAFEPATH: ``python -m`` must not put the working directory (this checkout) first."""
    return {"PYTHONPATH": code, "PYTHONSAFEPATH": "1"}


def unpack(out: str, commit: str = PREVIOUS) -> str:
    """``commit``'s ``rdma_cni`` under ``out``; skips the test where there is no git history. Checks
    that a process given :func:`env` really imports it."""
    os.makedirs(out, exist_ok=True)
    archive = subprocess.run(["git", "-C", REPO, "archive", commit, "rdma_cni"], capture_output=True,
                             check=False, timeout=60)
    if archive.returncode != 0:
        pytest.skip(f"no git history of {commit[:12]} here: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", out], input=archive.stdout, check=True, timeout=60)
    probe = subprocess.run([sys.executable, "-c", "import rdma_cni; print(rdma_cni.__file__)"],
                           capture_output=True, text=True, cwd=REPO, env=dict(os.environ, **env(out)),
                           check=True, timeout=60)
    assert probe.stdout.strip() == os.path.join(out, "rdma_cni", "__init__.py"), probe.stdout
    return out
