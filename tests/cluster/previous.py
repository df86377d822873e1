"""The previous version's image and chart, for the upgrade and rollback scenarios (tests/upgrade/):
the version and commit ``tests/upgrade/versions.json`` names, built the way that commit builds
itself, so that two real versions meet on the test cluster.

- The image: a ``git worktree`` of the commit (detached, in the cache dir, removed afterwards: the
  shared working tree is never touched) whose own ``scripts/build`` and ``conf/k8s/Dockerfile``
  :func:`cluster.images.build_product` runs, tagged ``rdma-cni:<version>``. The worktree gets a
  ``.venv`` link to this checkout's, which its scripts/build finds as the project's interpreter
  (the commit's dependencies are this checkout's or older; PyInstaller freezes the commit's
  ``rdma_cni`` from the worktree, ``--paths`` first).
- Cached like every cluster image (``<cache_root>/images/rdma-cni-<version>-<key>/``, the key
  being what that build is made of), and found again by the commit: ``<cache_root>/previous/
  <commit>.json`` names the image's cache dir, so a second call creates no worktree (~0 s).
- The chart: ``charts/rdma-cni`` of the commit by ``git archive`` into a directory of the caller's,
  what ``helm install`` of the previous version reads.

``python -m cluster.previous`` builds (or finds) the image and prints ``ref archive``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster import images
from cluster.buildah import Buildah, ImageError
from cluster.images import DEFAULT_CACHE_ROOT, PRODUCT_REPO, Image

log = logging.getLogger("cluster.previous")

REPO = Path(__file__).resolve().parents[2]
VERSIONS = REPO / "tests" / "upgrade" / "versions.json"


@dataclass(frozen=True)
class Previous:
    """The previous version: what it is called and the commit it is built from."""

    version: str
    commit: str

    @property
    def ref(self) -> str:
        return f"{PRODUCT_REPO}:{self.version}"


def previous() -> Previous:
    """The ``previous`` entry of tests/upgrade/versions.json."""
    doc = json.loads(VERSIONS.read_text())["previous"]
    return Previous(str(doc["version"]), str(doc["commit"]))


def _git(*args: str | Path, timeout: float = 120) -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), *(str(a) for a in args)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ImageError(f"git {' '.join(str(a) for a in args)}: {proc.stderr.strip()[-1500:]}")
    return proc.stdout


@contextlib.contextmanager
def worktree(commit: str, parent: Path) -> Iterator[Path]:
    """A detached worktree of ``commit`` under ``parent`` with this checkout's ``.venv`` linked in;
    removed (and unregistered from git) afterwards, also on failure."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=parent, prefix=f".worktree-{commit[:12]}."))
    path.rmdir()  # git creates it
    _git("worktree", "add", "--detach", "--quiet", path, commit)
    try:
        (path / ".venv").symlink_to(REPO / ".venv")
        yield path
    finally:
        with contextlib.suppress(ImageError):
            _git("worktree", "remove", "--force", path)
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(ImageError):
            _git("worktree", "prune")


def _pointer(cache_root: Path, prev: Previous) -> Path:
    return cache_root / "previous" / f"{prev.commit}.json"


def _cached(cache_root: Path, prev: Previous) -> Image | None:
    """The image a build of this commit cached, if its cache dir is still whole."""
    try:
        doc = json.loads(_pointer(cache_root, prev).read_text())
    except (OSError, ValueError):
        return None
    slot = images._Slot(prev.ref, Path(doc["dir"]))
    return slot.image() if slot.cached() else None


def build_previous(cache_root: Path = DEFAULT_CACHE_ROOT, prev: Previous | None = None) -> Image:
    """``rdma-cni:<previous version>``, built from its commit by its own scripts unless cached."""
    prev = prev or previous()
    found = _cached(cache_root, prev)
    if found is not None:
        log.info("%s: cached (commit %s) in %s", prev.ref, prev.commit[:12], found.archive.parent)
        return found
    b = Buildah(cache_root)
    with images._locked(cache_root / "images" / ".lock"):
        base = images.build_base(b, cache_root)
        with worktree(prev.commit, cache_root / "previous") as tree:
            log.info("%s: building commit %s with its own scripts/build in %s", prev.ref, prev.commit, tree)
            (image,) = images.build_product(b, tree, cache_root, base, (prev.version,))
        if b.dirty:
            b.rmi("--prune")
    pointer = _pointer(cache_root, prev)
    tmp = pointer.with_suffix(".tmp")
    tmp.write_text(json.dumps({"ref": prev.ref, "commit": prev.commit, "dir": str(image.archive.parent)}))
    tmp.rename(pointer)
    return image


def chart(dest: Path, prev: Previous | None = None) -> Path:
    """The previous version's ``charts/rdma-cni``, unpacked under ``dest`` from git history."""
    prev = prev or previous()
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", prev.commit, "charts/rdma-cni"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if archive.returncode != 0:
        raise ImageError(f"git archive {prev.commit[:12]} charts/rdma-cni: {archive.stderr.decode()[-1500:]}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True, timeout=60)
    return dest / "charts" / "rdma-cni"


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="previous: %(message)s", stream=sys.stderr)
    try:
        image = build_previous()
    except ImageError as e:
        print(f"previous: {e}", file=sys.stderr)
        return 1
    print(image.ref, image.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
