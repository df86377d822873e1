"""The test cluster's own image registry: kubelet pulls every image the cluster runs from it (the
seed's StatefulSet says ``imagePullPolicy: Always``, so an image merely imported into containerd is
not enough), while no registry on the internet is reachable.

Both programs come from go-containerregistry, built from the Go module proxy by path and version
(``gomod-registry/`` pins it; the build is cached under ``<cache_root>/registry-<version>-<hash of
go.mod and go.sum>/bin``):

- ``crane registry serve --address ADDR --disk DIR`` is the registry: plain HTTP on any address,
  blobs on disk. (``cmd/registry``, built too, only listens on ``localhost:<port>`` and keeps
  everything in memory, so it cannot serve a node on another address.) Manifests live in memory in
  either: a restarted registry serves nothing until the images are pushed again.
- ``crane push --insecure`` puts an image (:class:`cluster.images.Image`: its OCI layout, or its
  docker-archive) into it.

Where each image lands (:func:`registry_path`): the registry's domain is dropped and the rest of the
name kept, which is what containerd asks a mirror for (``hosts.toml`` of docker.io and
registry.k8s.io pointing at this registry; containerd expands a Docker Hub short name to
``library/X`` and requests ``<mirror>/v2/library/X/manifests/<tag>?ns=docker.io``, HEAD then GET):

- ``docker.io/library/debian:bookworm-slim`` -> ``<addr>/library/debian:bookworm-slim``
- ``docker.io/library/rdma-cni:0.1.0`` (and 0.1.1) -> ``<addr>/library/rdma-cni:0.1.0``
- ``docker.io/library/rdma-cni-test:0.1`` -> ``<addr>/library/rdma-cni-test:0.1``
- ``registry.k8s.io/pause:3.10.1`` -> ``<addr>/pause:3.10.1``

So ``image: rdma-cni:0.1.0`` in a manifest (normalised by kubelet to docker.io/library/rdma-cni:0.1.0)
is pulled as ``GET http://<addr>/v2/library/rdma-cni/manifests/0.1.0``. tests/cluster/test_cluster_images.py
has the cluster's containerd pull every image so, with ``[host."http://<addr>"] capabilities =
["pull", "resolve"]`` and no TLS settings: a ``skip_verify`` there makes containerd try HTTPS first
on every request (it logs so) before it falls back to HTTP.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.build import go_build
from cluster.images import DEFAULT_CACHE_ROOT, Image
from cluster.versions import GoBuild

log = logging.getLogger("cluster.registry")

VERSION = "v0.22.1"  # github.com/google/go-containerregistry, as gomod-registry/go.mod requires it
GOMOD_DIR = Path(__file__).resolve().parent / "gomod-registry"
PACKAGES = (
    "github.com/google/go-containerregistry/cmd/crane",
    "github.com/google/go-containerregistry/cmd/registry",
)


class RegistryError(RuntimeError):
    """The registry did not build, start or take an image: the message carries the tail of the output."""


@dataclass(frozen=True)
class RegistryBins:
    """The built programs: ``crane`` (client, and the server via ``crane registry serve``) and
    go-containerregistry's ``registry`` (in-memory, localhost only; not what :func:`start_registry`
    runs)."""

    crane: Path
    registry: Path
    version: str


def build_registry(cache_root: Path = DEFAULT_CACHE_ROOT) -> RegistryBins:
    """``crane`` and ``registry`` from the Go module proxy, unless already in the cache: the
    harness's one cached Go build (cluster.build.go_build), keyed by version and go.sum."""
    bin_dir = go_build(GoBuild("registry", VERSION, GOMOD_DIR, PACKAGES, "-s -w"), cache_root)
    return RegistryBins(bin_dir / "crane", bin_dir / "registry", VERSION)


def in_netns(argv: Sequence[str | Path], netns: str | None) -> list[str]:
    """``argv`` in the named network namespace (``ip netns add``'s /run/netns/NAME). nsenter rather
    than ``ip netns exec``: same network, but no private mount namespace with a remounted /sys, and
    it execs the program itself, so the pid the caller gets is the server's."""
    cmd = [str(a) for a in argv]
    return ["nsenter", f"--net=/run/netns/{netns}", "--", *cmd] if netns else cmd


def serve_argv(bins: RegistryBins, listen: str, storage_dir: Path) -> list[str]:
    """The registry's command line (plain HTTP on ``listen``, blobs under ``storage_dir``), for a
    caller that starts and records its processes itself (wrap it with :func:`in_netns`)."""
    return [str(bins.crane), "registry", "serve", "--address", listen, "--disk", str(storage_dir)]


def start_registry(
    bins: RegistryBins, listen: str, storage_dir: Path, netns: str | None = None, log_path: Path | None = None
) -> subprocess.Popen[bytes]:
    """Serve plain HTTP on ``listen`` (``host:port``), blobs under ``storage_dir``, inside ``netns``
    when given; returns once the port is listening. The caller owns the process: end it with
    :func:`stop_registry` (by its pid). Its log goes to ``log_path`` (default: storage_dir/registry.log,
    beside the blob dir ``sha256/``)."""
    storage_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_path or storage_dir / "registry.log"
    argv = serve_argv(bins, listen, storage_dir)
    with open(log_path, "ab") as out:
        start = out.tell()
        proc = subprocess.Popen(
            in_netns(argv, netns), stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        if "serving on port" in text:  # logged after net.Listen returned
            log.info("registry: serving %s (pid %d%s)", listen, proc.pid, f", netns {netns}" if netns else "")
            return proc
        if proc.poll() is not None:
            raise RegistryError(f"registry on {listen} exited {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.05)
    stop_registry(proc)
    raise RegistryError(f"registry on {listen}: not listening within 30 s (log {log_path})")


def stop_registry(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM the registry we started (its pid only), SIGKILL if it outlives ``grace``; reaped."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def registry_path(ref: str) -> str:
    """The repository path and tag ``ref`` lands at in this registry: its domain dropped
    (docker.io/library/rdma-cni:0.1.0 -> library/rdma-cni:0.1.0, registry.k8s.io/pause:3.10.1 ->
    pause:3.10.1). A name without a domain is Docker Hub's, as everywhere: rdma-cni:0.1.0 ->
    library/rdma-cni:0.1.0."""
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return rest
    return ref if sep else f"library/{ref}"


def crane(bins: RegistryBins, *args: str | Path, netns: str | None = None, timeout: float = 300) -> str:
    """Run crane (in ``netns`` when given, to reach a registry only that namespace sees); its stdout."""
    argv = in_netns([bins.crane, *args], netns)
    proc = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RegistryError(
            f"crane {' '.join(str(a) for a in args)}: exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def push(bins: RegistryBins, image: Image, registry_addr: str, netns: str | None = None) -> str:
    """Push ``image`` to ``registry_addr`` (plain HTTP) at :func:`registry_path` of its ref: its OCI
    layout (gzip layers, copied as they are) when it has one, else its docker-archive (which crane
    gzips on the way); the pushed reference with its digest (``<addr>/library/rdma-cni@sha256:...``)."""
    dest = f"{registry_addr}/{registry_path(image.ref)}"
    src = image.oci_layout if image.oci_layout is not None and image.oci_layout.is_dir() else image.archive
    t0 = time.monotonic()
    out = crane(bins, "push", "--insecure", src, dest, netns=netns).strip()
    log.info("registry: pushed %s -> %s in %.1f s", image.ref, dest, time.monotonic() - t0)
    return out.splitlines()[-1] if out else dest


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cluster.registry [--cache C] [--listen A --storage D [--netns N] [--push-all R]]``:
    build (or find) the programs; with --listen, serve until Ctrl-C, after pushing every cached image
    when --push-all names the repo."""
    p = argparse.ArgumentParser(prog="python -m cluster.registry")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE_ROOT)
    p.add_argument("--listen")
    p.add_argument("--storage", type=Path)
    p.add_argument("--netns")
    p.add_argument("--push-all", type=Path, metavar="REPO", help="build_images(REPO) and push each")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    bins = build_registry(args.cache)
    print(bins.crane, bins.registry)
    if not args.listen:
        return 0
    if args.storage is None:
        p.error("--listen needs --storage")
    proc = start_registry(bins, args.listen, args.storage, args.netns)
    try:
        if args.push_all:
            from cluster.images import build_images

            for img in build_images(args.push_all, args.cache, ("0.1.0", "0.1.1")):
                print(push(bins, img, args.listen, args.netns))
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop_registry(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
