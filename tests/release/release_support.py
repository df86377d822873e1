"""What the release tests share: a clean clone of this repository's HEAD to release from, and
scripts/release run in it the way a person runs it (a relative path, from another dir)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cluster import registry as reg

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.1.0"  # what the checkout declares and CHANGELOG.md has an entry for


def clone(parent: Path) -> Path:
    """A clean clone of HEAD under ``parent`` (origin: this repository), with this checkout's venv
    (kept out of git status, as .venv/ is here)."""
    path = parent / "rdma-cni"
    subprocess.run(["git", "clone", "-q", str(REPO), str(path)], check=True)
    (path / ".venv").symlink_to(REPO / ".venv")
    with open(path / ".git" / "info" / "exclude", "a") as f:
        f.write(".venv\n")
    return path


def release(repo: Path, *args: str, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    """``scripts/release ARGS`` of ``repo`` (in ``netns`` when given, to reach a registry only that
    namespace sees); never raises on its exit code."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    argv = reg.in_netns([f"{repo.name}/scripts/release", *args], netns)
    return subprocess.run(argv, cwd=repo.parent, capture_output=True, text=True, env=env, timeout=1200)
