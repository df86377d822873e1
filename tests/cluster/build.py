"""``scripts/cluster build``: the cluster's binaries from the Go module proxy, by module path and
version only, cached outside the repository.

Each :class:`~cluster.versions.GoBuild` is one ``go build`` of main packages in a module of ours
(``gomod-*/``) that pins the upstream module. Kubernetes' own go.mod replaces its staging modules
with paths inside its repository, so ours requires ``k8s.io/kubernetes`` at a tag and replaces every
staging module with the same release (the list copied from that tag's replace block). A build goes
to a temporary dir and is renamed into the cache when complete, so a build killed half way leaves
nothing that looks done. runc and the CNI reference plugins come from Debian.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.versions import BUILDS, CACHE_ROOT, GoBuild

log = logging.getLogger("cluster.build")

RUNC = "/usr/sbin/runc"  # Debian's; containerd 2.4 accepts it (the cluster tests start pods with it)
CNI_PLUGINS = "/usr/lib/cni"  # Debian's containernetworking-plugins: ptp, host-local, loopback
DEBIAN_TOOLS = ("iptables", "conntrack", "ethtool", "socat", "openssl", "runc", "containernetworking-plugins")


class BuildError(RuntimeError):
    """A build failed; the message names it and carries the tail of its output."""


@dataclass(frozen=True)
class Binaries:
    """Where each program of the cluster is."""

    dirs: tuple[Path, ...]

    def path(self, name: str) -> str:
        for d in self.dirs:
            if (d / name).exists():
                return str(d / name)
        found = shutil.which(name)
        if found:
            return found
        raise BuildError(f"{name}: not built (run scripts/cluster build)")


def go_build(b: GoBuild, cache_root: Path = CACHE_ROOT) -> Path:
    """Build ``b`` unless its cache dir under ``cache_root`` is complete; the bin dir."""
    bin_dir = cache_root / b.key / "bin"
    if all((bin_dir / n).is_file() for n in b.binaries()):
        log.info("%s %s: cached in %s", b.name, b.version, bin_dir)
        return bin_dir
    cache_root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log.info("%s %s: building %s (first time only)", b.name, b.version, " ".join(b.binaries()))
    env = dict(os.environ, CGO_ENABLED="1" if b.cgo else "0", GOFLAGS="-mod=mod")
    with tempfile.TemporaryDirectory(dir=cache_root, prefix=f".{b.name}-") as tmp:
        out = Path(tmp) / "bin"
        out.mkdir()
        cmd = ["go", "build", "-trimpath", "-ldflags", b.ldflags, "-o", f"{out}/"]
        if b.tags:
            cmd += ["-tags", b.tags]
        proc = subprocess.run(
            [*cmd, *b.packages],
            cwd=b.gomod_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise BuildError(f"{b.name} {b.version}: go build failed:\n{proc.stderr[-4000:]}")
        for made, called in b.rename:
            (out / made).rename(out / called)
        missing = [n for n in b.binaries() if not (out / n).is_file()]
        if missing:
            raise BuildError(f"{b.name}: go build made no {missing}")
        shutil.rmtree(bin_dir.parent, ignore_errors=True)
        bin_dir.parent.mkdir(parents=True)
        out.rename(bin_dir)
    log.info("%s %s: built in %.0f s", b.name, b.version, time.monotonic() - t0)
    return bin_dir


def ensure_debian_tools() -> None:
    """iptables for kube-proxy, runc and the reference CNI plugins: from Debian, as a node has them."""
    missing = [
        p
        for p in DEBIAN_TOOLS
        if subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True, check=False
        ).stdout.find("install ok installed")
        < 0
    ]
    if missing:
        log.info("installing Debian packages: %s", " ".join(missing))
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", *missing],
            check=True,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
        )


GO_MIN = (1, 26)


def use_go() -> str:
    """The machine's Go 1.26+ first on PATH for every build here (images and the registry too):
    Debian's golang-go (1.19, which scripts/setup installs for cnitool) may come first on a root
    shell's PATH, and Kubernetes 1.37 needs Go 1.26."""
    for cand in (os.environ.get("GO", ""), "/usr/local/go/bin/go", shutil.which("go") or ""):
        if not cand or not os.access(cand, os.X_OK):
            continue
        out = subprocess.run([cand, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
        parts = out.strip().removeprefix("go").split(".")
        if len(parts) >= 2 and (int(parts[0]), int(parts[1].split("rc")[0])) >= GO_MIN:
            os.environ["PATH"] = f"{os.path.dirname(cand)}:{os.environ['PATH']}"
            return cand
    raise BuildError("no Go 1.26 or newer (the cluster's Kubernetes 1.37 needs it): install it or set GO=")


def build_all() -> Binaries:
    """Everything ``up`` runs; cached builds cost nothing."""
    ensure_debian_tools()
    use_go()
    dirs = tuple(go_build(b) for b in BUILDS)
    return Binaries(dirs)


def binaries() -> Binaries:
    """The cached builds, without building (``up`` says what is missing)."""
    return Binaries(tuple(b.bin_dir for b in BUILDS))


__all__ = ["CACHE_ROOT", "CNI_PLUGINS", "RUNC", "Binaries", "BuildError", "binaries", "build_all", "go_build"]
