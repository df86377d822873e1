"""The README's shipping path, verbatim, on a clean copy of the checkout with no ``PYTHON`` set.

``./scripts/setup`` installs into ``.venv/``; ``scripts/build`` must freeze with that interpreter,
and ``dist/rdma-cni/install.sh --mode vpc-cni`` must lay the bundle down. The other bundle tests
hand the build an interpreter on ``PATH`` (scripts/test puts ``.venv/bin`` first), which is how a
build that ran plain ``python3`` went unseen: this test runs the commands as a new user types them,
with neither ``PYTHON`` nor the venv on ``PATH``. The install runs in a private mount namespace
whose node directories are tmpfs, so the host's ``/opt/cni/bin`` and ``/etc/cni/net.d`` are never
touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.netns

# The node paths install.sh writes, each a fresh tmpfs inside the test's mount namespace.
NODE_DIRS = ("/opt/cni/bin", "/etc/cni/net.d", "/etc/rdma-cni", "/var/lib/cni")
# the host dirs compared before and after: not /var/lib/cni, which other tests' runtimes (Debian's
# containerd, libcni's cache) write on this machine while the suite runs
HOST_DIRS = ("/opt/cni/bin", "/etc/cni/net.d", "/etc/rdma-cni")


def clean_copy(dest: Path) -> Path:
    """The checkout's files as a clean clone has them: tracked and not ignored, no .venv, no dist."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet committed
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)
    assert not (dest / ".venv").exists() and not (dest / "dist").exists()
    return dest


def user_env() -> dict[str, str]:
    """A root shell's environment: no PYTHON, and no venv of the suite on PATH."""
    venv_bin = str(REPO / ".venv" / "bin")
    path = ":".join(p for p in os.environ["PATH"].split(":") if p and p != venv_bin)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = path
    return env


def sh(cmd: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=user_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_readme_setup_build_install_verbatim_without_python_set(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("scripts/setup and install.sh run as root")
    clone = clean_copy(tmp_path / "clone")
    assert "PYTHON" not in user_env()
    host_before = {d: _listing(d) for d in HOST_DIRS}

    setup = sh("./scripts/setup", clone)
    assert setup.returncode == 0, setup.stderr[-3000:]
    build = sh("scripts/build", clone)
    assert build.returncode == 0, f"scripts/build after scripts/setup failed:\n{build.stderr[-3000:]}"
    assert (clone / "dist" / "rdma-cni" / "rdma-cni").is_file()

    mounts = "; ".join(f"mkdir -p {d} && mount -t tmpfs tmpfs {d}" for d in NODE_DIRS)
    inside = (
        f"{mounts}; dist/rdma-cni/install.sh --mode vpc-cni"
        " && CNI_COMMAND=VERSION /opt/cni/bin/rdma-macvlan </dev/null"
        " && ls /etc/cni/net.d >&2"
    )
    install = sh(f"unshare -m --propagation private bash -ec '{inside}'", clone, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    version = json.loads(install.stdout)
    assert "1.1.0" in version["supportedVersions"]
    assert "00-rdma-multus.conflist" in install.stderr
    assert {d: _listing(d) for d in HOST_DIRS} == host_before, "the install reached the host's own dirs"


def _listing(d: str) -> list[tuple[str, float]]:
    """A node dir's entries and mtimes, to prove the host's own one was not written."""
    p = Path(d)
    return sorted((e.name, e.lstat().st_mtime) for e in p.iterdir()) if p.is_dir() else []
