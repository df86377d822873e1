"""buildah and the Debian mirrors it builds from, for the test cluster's images (cluster.images): the
one place that runs a build step and turns its failure into an :class:`ImageError` naming the step.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

log = logging.getLogger("cluster.images")

SUITE = "bookworm"

FALLBACK_MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)


class ImageError(RuntimeError):
    """A step of an image build failed: names the step and carries the tail of its output."""


def run(
    cmd: Sequence[str | Path],
    what: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    capture: bool = True,
) -> str:
    """Run ``cmd``; its stdout, or :class:`ImageError` with the tail of its output. ``capture=False``
    lets a long step's progress through to our stderr (scripts/build's)."""
    argv = [str(c) for c in cmd]
    log.debug("%s: %s", what, " ".join(argv))
    if capture:
        proc = subprocess.run(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            out = (proc.stdout[-2000:] + "\n" + proc.stderr[-4000:]).strip()
            raise ImageError(f"{what}: {argv[0]} exited {proc.returncode}:\n{out}")
        return proc.stdout
    proc2 = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr, check=False)
    if proc2.returncode != 0:
        raise ImageError(f"{what}: {argv[0]} exited {proc2.returncode} (its output is above)")
    return ""


def debian_mirrors(apt_dir: Path = Path("/etc/apt")) -> list[str]:
    """The bookworm ``deb`` lines (main) of this machine's apt sources, one-line and deb822 alike,
    so the base image comes from the mirror (and security/updates suites) the machine already
    reaches; the public ones when there are none."""
    entries: list[tuple[str, str, str]] = []  # (type, uri, suite) with component main
    lists = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for f in lists:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) >= 4 and words[1].startswith("["):  # deb [opts] uri suite comps
                while len(words) > 2 and not words[1].endswith("]"):
                    del words[1]
                del words[1]
            if len(words) >= 4 and "main" in words[3:]:
                entries.append((words[0], words[1], words[2]))
    for f in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for para in f.read_text(errors="replace").split("\n\n"):
            fields: dict[str, str] = {}
            for line in para.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                k, v = line.split(":", 1)
                fields[k.strip().lower()] = v.strip()
            if (
                fields.get("enabled", "yes").lower() == "no"
                or "main" not in fields.get("components", "").split()
            ):
                continue
            for t in fields.get("types", "").split():
                for uri in fields.get("uris", "").split():
                    for suite in fields.get("suites", "").split():
                        entries.append((t, uri, suite))
    out: list[str] = []
    for t, uri, suite in entries:
        line = f"deb {uri.rstrip('/')} {suite} main"
        if t == "deb" and (suite == SUITE or suite.startswith(SUITE + "-")) and line not in out:
            out.append(line)
    return out or list(FALLBACK_MIRRORS)


# ---- buildah ------------------------------------------------------------------------------------


class Buildah:
    """buildah on a storage of its own under the cache (see the module's docstring)."""

    def __init__(self, cache_root: Path) -> None:
        self.root = cache_root / "images" / "storage"
        # runroot holds locks and mount state: tmpfs, one per storage root.
        self.runroot = Path("/run/rdma-cni-images") / f"buildah-{digest(str(self.root))}"
        self.driver = "overlay"
        self.dirty = False  # something was built: prune the storage at the end

    def argv(self, *args: str | Path) -> list[str]:
        return [
            "buildah",
            "--root",
            str(self.root),
            "--runroot",
            str(self.runroot),
            "--storage-driver",
            self.driver,
            *[str(a) for a in args],
        ]

    def __call__(self, *args: str | Path, what: str, cwd: Path | None = None) -> str:
        return run(self.argv(*args), what, cwd=cwd).strip()

    def image_id(self, ref: str) -> str | None:
        proc = subprocess.run(
            self.argv("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        return (proc.stdout.strip() or None) if proc.returncode == 0 else None

    def rmi(self, *args: str) -> None:
        """Remove images (or ``--prune`` the dangling ones); what fails to go stays, harmlessly."""
        subprocess.run(self.argv("rmi", *args), stdin=subprocess.DEVNULL, capture_output=True, check=False)

    def save(self, ref: str, archive: Path) -> None:
        """docker-archive of ``ref`` that names it ``ref`` in full (RepoTags)."""
        self("push", "-q", ref, f"docker-archive:{archive}:{ref}", what=f"{ref}: save")

    def load(self, archive: Path, ref: str) -> str:
        """Put a saved image back into the storage under ``ref`` (a wiped storage, the cache kept)."""
        out = self("pull", "-q", f"docker-archive:{archive}", what=f"{ref}: load {archive}")
        image_id = out.splitlines()[-1].strip()
        self("tag", image_id, ref, what=f"{ref}: tag")
        return image_id

    @contextlib.contextmanager
    def container(self, image: str, what: str) -> Iterator[str]:
        """A working container of ``image`` (``scratch`` too), removed afterwards even on failure."""
        ctr = self("from", "--pull-never", "--quiet", image, what=f"{what}: from {image}")
        try:
            yield ctr
        finally:
            subprocess.run(self.argv("rm", ctr), stdin=subprocess.DEVNULL, capture_output=True, check=False)


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.hexdigest()[:16]
