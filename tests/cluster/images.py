"""The test cluster's container images, built here from Debian packages and this repository: no image
registry on the internet is reachable from the machines that run the cluster, and there is no Docker
engine, so every image a pod (or containerd's sandbox) needs is made locally with buildah and saved
as a docker-archive tar that keeps its full name (``RepoTags``), ready for ``crane push`` into the
cluster's own registry (:mod:`cluster.registry`) or a ``ctr images import``.

- ``docker.io/library/debian:bookworm-slim``: mmdebstrap ``--variant=minbase`` of bookworm from the
  Debian mirrors this machine's apt uses (bookworm, -updates, -security), slimmed like the official
  image (no man pages, docs, locales), ``CMD ["bash"]``; kept in buildah's storage under that name,
  which is what ``FROM debian:bookworm-slim`` of conf/k8s/Dockerfile finds (``--pull-never``).
- ``docker.io/library/rdma-cni:<tag>``: ``scripts/build`` run as the README says (no PYTHON; it
  writes dist/rdma-cni), then conf/k8s/Dockerfile with the repository as context, once per call;
  each tag is that image plus the label ``org.opencontainers.image.version=<tag>`` (and the empty
  layer buildah's commit adds), so two tags of one bundle have two digests (a rolling update from
  0.1.0 to 0.1.1 really changes the image) and share every real layer; a second tag costs ~0.1 s.
- ``docker.io/library/rdma-cni-test:0.1``: the base plus iproute2, iputils-ping and procps (sh,
  sleep, cat, ls come with the base), ``CMD ["sleep", "infinity"]``: the seed's pods.
- ``docker.io/library/multus-cni:<version>``: upstream Multus's cached Go build laid out as its own
  Dockerfiles lay it, on the base (:func:`build_multus`); pushed to the registry, not imported.
- ``registry.k8s.io/pause:3.10.1``: FROM scratch, ``/pause`` compiled statically by gcc from
  Kubernetes' own build/pause/linux/pause.c of k8s.io/kubernetes (found through ``go mod download``,
  i.e. the Go module cache) with its Makefile's flags; ``ENTRYPOINT ["/pause"]``, ``USER
  65535:65535`` as upstream's.

Caching: each image is saved as ``<cache_root>/images/<name>-<key>/image.tar`` (docker-archive),
``oci/`` (the same image as an OCI layout with gzip layers, made by skopeo: what the registry push
sends) and ``meta.json``, all written to a temporary dir that is renamed into place: a build killed
half way leaves nothing that looks done. The key is a hash of what the image is made of: the apt
sources and options of the base; the files scripts/build and the Dockerfile read (rdma_cni/, conf/,
the build scripts), the venv's installed distributions and the base's key for rdma-cni; pause.c,
gcc's version and the flags for pause. So a second :func:`build_images` builds nothing and runs
nothing but hashing (~0.1 s; the bundle is not rebuilt to learn its hash). The base is NOT keyed on
the Debian archive's state: delete its cache dir to take newer packages. Of each image, the dirs of
the ``KEEP`` most recently used keys stay; older ones are pruned.

buildah runs with a storage of its own (``<cache_root>/images/storage``, overlay driver; runroot
under /run/rdma-cni-images; ``--isolation chroot`` for the one RUN, the test image's apt-get), holding
only the base between calls: the archives are the cache. The machine's /var/lib/containers stays
untouched. Calls are serialised by a lock file (``images/.lock``), so the harness and a test may call
:func:`build_images` at the same time.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.buildah import SUITE, Buildah, ImageError, debian_mirrors
from cluster.buildah import digest as _digest
from cluster.buildah import run as _run

log = logging.getLogger("cluster.images")

# Bump to rebuild every image (a change of how they are made that the keys do not see).
SCHEMA = "1"
KUBERNETES = (
    "v1.37.2"  # whose build/pause/linux/pause.c makes the sandbox image (cluster.versions pins it too)
)
DEFAULT_CACHE_ROOT = Path(os.environ.get("RDMA_CNI_CLUSTER_CACHE", "/var/cache/rdma-cni/cluster"))

BASE_REF = "docker.io/library/debian:bookworm-slim"
PRODUCT_REPO = "docker.io/library/rdma-cni"
TEST_REF = "docker.io/library/rdma-cni-test:0.1"
PAUSE_REF = "registry.k8s.io/pause:3.10.1"
MULTUS_REPO = "docker.io/library/multus-cni"
# Where upstream's images put Multus: images/Dockerfile.thick (the daemon's command and the
# installer's binaries) and images/Dockerfile (the thin DaemonSet's /install_multus, /thin_entrypoint).
MULTUS_BIN = "/usr/src/multus-cni/bin"
MULTUS_AT_ROOT = ("install_multus", "thin_entrypoint")
VERSION_LABEL = "org.opencontainers.image.version"

# What the official bookworm-slim leaves out (debuerreotype's slimification), as dpkg path filters.
SLIM_DPKG_OPTS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/groff/*",
)
TEST_PACKAGES = ("iproute2", "iputils-ping", "procps")
# scripts/build's inputs besides rdma_cni/ and conf/ (the bundle bakes in conf/ and install.sh) and
# the venv's distributions (hashed by name and version). Not pyproject.toml: PyInstaller never reads
# it, and a new pytest marker there must not rebuild the image.
BUILD_SCRIPTS = ("scripts/build", "scripts/build-client", "scripts/install.sh", "scripts/lib.sh")
PAUSE_CFLAGS = ("-Os", "-Wall", "-Werror", "-static", "-DVERSION=v3.10.1-rdma-cni-test")


@dataclass(frozen=True)
class Image:
    """One image, saved: ``ref`` is its full name (also the archive's RepoTags), ``archive`` a
    docker-archive tar of exactly one image (uncompressed layers), ``oci_layout`` the same image as
    an OCI layout with gzip layers, which is what :func:`cluster.registry.push` sends: pushing the
    archive makes crane gzip every layer again on every push (~25 s for all five images here),
    pushing the layout only copies blobs (well under a second)."""

    ref: str
    archive: Path
    oci_layout: Path | None = None

    @property
    def repository(self) -> str:
        """``docker.io/library/rdma-cni`` of ``docker.io/library/rdma-cni:0.1.0``."""
        return self.ref.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


# ---- small helpers ------------------------------------------------------------------------------


def _tree_digest(root: Path, rels: Sequence[str]) -> str:
    """Hash of the paths (relative to ``root``), modes and contents of the files under ``rels``
    (files or dirs; __pycache__ and .pyc skipped, missing ones recorded as missing)."""
    h = hashlib.sha256()
    for rel in rels:
        top = root / rel
        if not top.exists():
            h.update(f"missing {rel}\n".encode())
            continue
        files = (
            [top]
            if top.is_file()
            else sorted(
                p
                for p in top.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            )
        )
        for f in files:
            h.update(f"{f.relative_to(root)} {f.stat().st_mode & 0o111:o}\n".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- the cache ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    """One image's cache dir."""

    ref: str
    dir: Path

    @property
    def archive(self) -> Path:
        return self.dir / "image.tar"

    @property
    def meta(self) -> Path:
        return self.dir / "meta.json"

    def cached(self) -> dict[str, object] | None:
        try:
            meta = json.loads(self.meta.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("ref") != self.ref or not self.archive.is_file():
            return None
        return meta

    @property
    def oci(self) -> Path:
        return self.dir / "oci"

    def image(self) -> Image:
        return Image(self.ref, self.archive, self.oci if (self.oci / "index.json").is_file() else None)


def _slot(cache_root: Path, ref: str, key: str) -> _Slot:
    name = ref.rsplit("/", 1)[-1].replace(":", "-")
    return _Slot(ref, cache_root / "images" / f"{name}-{key}")


def _oci_layout(archive: Path, dest: Path) -> None:
    """The OCI layout (gzip layers) of a docker-archive, made by skopeo next to it."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _run(["skopeo", "copy", "--quiet", f"docker-archive:{archive}", f"oci:{tmp}"], f"{archive}: OCI layout")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _store(
    b: Buildah, slot: _Slot, image_id: str, seconds: float, inputs: dict[str, object], keep: bool = False
) -> Image:
    """Save ``slot.ref`` from buildah's storage into its cache dir, atomically; then drop it from the
    storage unless ``keep`` (the base, which later builds start FROM): the archive is the cache, and
    the storage must not grow by an image per source change."""
    slot.dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=slot.dir.parent, prefix=f".{slot.dir.name}."))
    t0 = time.monotonic()
    try:
        b.save(slot.ref, tmp / "image.tar")
        _oci_layout(tmp / "image.tar", tmp / "oci")
        save_s = time.monotonic() - t0
        meta = {
            "ref": slot.ref,
            "image_id": image_id,
            "build_seconds": round(seconds, 1),
            "save_seconds": round(save_s, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "inputs": inputs,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        shutil.rmtree(slot.dir, ignore_errors=True)
        tmp.rename(slot.dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mb = slot.archive.stat().st_size / 1e6
    log.info("%s: built in %.0f s, saved in %.0f s: %s (%.0f MB)", slot.ref, seconds, save_s, slot.dir, mb)
    b.dirty = True
    if not keep:
        b.rmi(slot.ref)
    return slot.image()


KEEP = 3  # cache dirs kept per image name: the current one and the two used most recently before it


def _prune(cache_root: Path, current: Sequence[Image]) -> None:
    """Each image's cache dirs of other keys (older sources) beyond the ``KEEP`` most recently used
    go, so the cache does not grow by ~170 MB per commit; a current dir is never removed, and using
    a dir marks it recent (its mtime)."""
    keep = {i.archive.parent for i in current}
    for d in keep:
        os.utime(d)
    for d in keep:
        name = d.name[: -len("-0123456789abcdef")]
        pattern = re.compile(re.escape(name) + "-[0-9a-f]{16}")
        same = [p for p in d.parent.iterdir() if pattern.fullmatch(p.name) and p.is_dir()]
        same.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for old in same[KEEP:]:
            if old not in keep:
                log.info("pruning %s (an older build of %s)", old, name)
                shutil.rmtree(old, ignore_errors=True)


def _ensure_in_storage(b: Buildah, slot: _Slot) -> None:
    """A cached image that a later build starts FROM must be in buildah's storage as the very image
    that was cached (not an older one under the same name)."""
    meta = slot.cached()
    assert meta is not None
    if b.image_id(slot.ref) != meta.get("image_id"):
        log.info("%s: loading %s into buildah's storage", slot.ref, slot.archive)
        b.load(slot.archive, slot.ref)


# ---- the images ---------------------------------------------------------------------------------


def _base_inputs(mirrors: list[str]) -> dict[str, object]:
    return {
        "schema": SCHEMA,
        "suite": SUITE,
        "variant": "minbase",
        "mirrors": mirrors,
        "dpkgopts": list(SLIM_DPKG_OPTS),
    }


def build_base(b: Buildah, cache_root: Path) -> _Slot:
    """``debian:bookworm-slim`` by mmdebstrap, imported into buildah's storage under that name."""
    mirrors = debian_mirrors()
    inputs = _base_inputs(mirrors)
    slot = _slot(cache_root, BASE_REF, _digest(json.dumps(inputs, sort_keys=True)))
    if slot.cached():
        log.info("%s: cached in %s", BASE_REF, slot.dir)
        return slot  # into buildah's storage only when an image is built FROM it
    t0 = time.monotonic()
    log.info("%s: mmdebstrap %s minbase from %s (first time only, ~1-2 min)", BASE_REF, SUITE, mirrors)
    slot.dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=slot.dir.parent, prefix=".mmdebstrap.") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        cmd: list[str | Path] = [
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            "--mode=root",
            "--format=tar",
            "--skip=output/dev",
            '--aptopt=Apt::Install-Recommends "false"',
        ]
        cmd += [f"--dpkgopt={o}" for o in SLIM_DPKG_OPTS]
        _run([*cmd, SUITE, rootfs, *mirrors], f"{BASE_REF}: mmdebstrap", capture=True)
        with b.container("scratch", BASE_REF) as ctr:
            b("add", ctr, rootfs, "/", what=f"{BASE_REF}: add the rootfs")
            b(
                "config",
                "--cmd",
                '["bash"]',
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ctr,
                what=f"{BASE_REF}: config",
            )
            image_id = b("commit", "--quiet", ctr, BASE_REF, what=f"{BASE_REF}: commit")
    _store(b, slot, image_id, time.monotonic() - t0, inputs, keep=True)
    return slot


def _product_key(repo: Path, base: _Slot) -> tuple[str, dict[str, object]]:
    """What the bundle and the Dockerfile's image are made of, read without building anything."""
    venv_dists = sorted(p.name for p in repo.glob(".venv/lib/python*/site-packages/*.dist-info"))
    inputs: dict[str, object] = {
        "schema": SCHEMA,
        "base": base.dir.name,
        "sources": _tree_digest(repo, ["rdma_cni", "conf", *BUILD_SCRIPTS]),
        "venv": _digest("\n".join(venv_dists)),
    }
    return _digest(json.dumps(inputs, sort_keys=True)), inputs


def build_product(b: Buildah, repo: Path, cache_root: Path, base: _Slot, tags: Sequence[str]) -> list[Image]:
    """``rdma-cni:<tag>`` for each tag: one ``scripts/build`` and one Dockerfile build (only when a tag
    is missing from the cache), then a label per tag."""
    key, inputs = _product_key(repo, base)
    slots = [_slot(cache_root, f"{PRODUCT_REPO}:{t}", _digest(key, t)) for t in tags]
    missing = [s for s in slots if not s.cached()]
    for s in slots:
        if s not in missing:
            log.info("%s: cached in %s", s.ref, s.dir)
    if missing:
        _ensure_in_storage(b, base)
        t0 = time.monotonic()
        log.info("rdma-cni: scripts/build (the PyInstaller bundle, ~1 min) in %s", repo)
        env = {k: v for k, v in os.environ.items() if k != "PYTHON"}  # the README's way: no variable
        _run([repo / "scripts" / "build"], "scripts/build", cwd=repo, env=env, capture=False)
        bundle_s = time.monotonic() - t0
        build_id = (repo / "dist" / "rdma-cni" / "BUILD_ID").read_text().strip()
        built = f"localhost/rdma-cni-build:{key}"
        t1 = time.monotonic()
        b(
            "bud",
            "--pull-never",
            "--isolation",
            "chroot",
            "--quiet",
            "-f",
            repo / "conf/k8s/Dockerfile",
            "-t",
            built,
            repo,
            what="rdma-cni: conf/k8s/Dockerfile",
            cwd=repo,
        )
        docker_s = time.monotonic() - t1
        log.info("rdma-cni: bundle %s in %.0f s, Dockerfile in %.0f s", build_id, bundle_s, docker_s)
        for s in missing:
            t2 = time.monotonic()
            tag = s.ref.rsplit(":", 1)[1]
            with b.container(built, s.ref) as ctr:
                b("config", "--label", f"{VERSION_LABEL}={tag}", ctr, what=f"{s.ref}: label")
                image_id = b("commit", "--quiet", ctr, s.ref, what=f"{s.ref}: commit")
            first = s is missing[0]
            seconds = time.monotonic() - t2 + (bundle_s + docker_s if first else 0.0)
            _store(
                b,
                s,
                image_id,
                seconds,
                {
                    **inputs,
                    "tag": tag,
                    "bundle_build_id": build_id,
                    "bundle_seconds": round(bundle_s, 1),
                    "dockerfile_seconds": round(docker_s, 1),
                },
            )
        b.rmi(built)
    return [s.image() for s in slots]


def build_test_image(b: Buildah, cache_root: Path, base: _Slot) -> Image:
    """The seed's pods' image: the base plus ip, ping and ps, installed by apt inside it."""
    inputs: dict[str, object] = {"schema": SCHEMA, "base": base.dir.name, "packages": list(TEST_PACKAGES)}
    slot = _slot(cache_root, TEST_REF, _digest(json.dumps(inputs, sort_keys=True)))
    if slot.cached():
        log.info("%s: cached in %s", TEST_REF, slot.dir)
        return slot.image()
    _ensure_in_storage(b, base)
    t0 = time.monotonic()
    log.info("%s: apt-get install %s in the base", TEST_REF, " ".join(TEST_PACKAGES))
    script = (
        "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
        + " ".join(TEST_PACKAGES)
        + " && apt-get clean && rm -rf /var/lib/apt/lists/*"
    )
    with b.container(BASE_REF, TEST_REF) as ctr:
        b("run", "--isolation", "chroot", ctr, "--", "sh", "-c", script, what=f"{TEST_REF}: apt-get install")
        b("config", "--cmd", '["sleep", "infinity"]', ctr, what=f"{TEST_REF}: config")
        image_id = b("commit", "--quiet", ctr, TEST_REF, what=f"{TEST_REF}: commit")
    return _store(b, slot, image_id, time.monotonic() - t0, inputs)


def build_multus(b: Buildah, cache_root: Path, base: _Slot, bin_dir: Path, version: str) -> Image:
    """Upstream Multus's image, ``multus-cni:<version>``: the cached Go build's binaries laid out as
    its own Dockerfiles lay them (:data:`MULTUS_BIN`, and :data:`MULTUS_AT_ROOT` at ``/`` too), on
    the Debian base (upstream's thick image is debian:stable-slim), so both of its DaemonSets
    (deployments/multus-daemonset.yml and -thick.yml) run it with only the image name changed."""
    names = sorted(p.name for p in bin_dir.iterdir() if p.is_file())
    # the build's cache dir name is its key (version, packages, go.mod and go.sum): no need to hash
    # ~250 MB of binaries on every prepare
    inputs: dict[str, object] = {"schema": SCHEMA, "base": base.dir.name, "build": bin_dir.parent.name,
                                 "binaries": names}
    ref = f"{MULTUS_REPO}:{version}"
    slot = _slot(cache_root, ref, _digest(json.dumps(inputs, sort_keys=True)))
    if slot.cached():
        log.info("%s: cached in %s", ref, slot.dir)
        return slot.image()
    _ensure_in_storage(b, base)
    t0 = time.monotonic()
    with b.container(BASE_REF, ref) as ctr:
        for n in names:
            b("copy", "--chmod", "0755", ctr, str(bin_dir / n), f"{MULTUS_BIN}/{n}", what=f"{ref}: copy {n}")
            if n in MULTUS_AT_ROOT:
                b("copy", "--chmod", "0755", ctr, str(bin_dir / n), f"/{n}", what=f"{ref}: copy /{n}")
        b("config", "--entrypoint", f'["{MULTUS_BIN}/multus-daemon"]', ctr, what=f"{ref}: config")
        image_id = b("commit", "--quiet", ctr, ref, what=f"{ref}: commit")
    return _store(b, slot, image_id, time.monotonic() - t0, inputs)


def pause_source(kubernetes: str = KUBERNETES) -> Path:
    """build/pause/linux/pause.c of k8s.io/kubernetes@``kubernetes``, from the Go module cache
    (``go mod download`` fetches the module by path and version when it is not there yet)."""
    out = _run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{kubernetes}"], "pause: go mod download"
    )
    info = json.loads(out)
    src = Path(str(info["Dir"])) / "build" / "pause" / "linux" / "pause.c"
    if not src.is_file():
        raise ImageError(f"pause: no {src} in k8s.io/kubernetes@{kubernetes}")
    return src


def build_pause(b: Buildah, cache_root: Path) -> Image:
    """The sandbox image: a static /pause from Kubernetes' own source, FROM scratch."""
    src = pause_source()
    gcc = _run(["gcc", "--version"], "gcc --version").splitlines()[0]
    inputs: dict[str, object] = {
        "schema": SCHEMA,
        "kubernetes": KUBERNETES,
        "pause.c": _digest(src.read_bytes()),
        "gcc": gcc,
        "cflags": list(PAUSE_CFLAGS),
    }
    slot = _slot(cache_root, PAUSE_REF, _digest(json.dumps(inputs, sort_keys=True)))
    if slot.cached():
        log.info("%s: cached in %s", PAUSE_REF, slot.dir)
        return slot.image()
    t0 = time.monotonic()
    log.info("%s: gcc -static %s", PAUSE_REF, src)
    slot.dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=slot.dir.parent, prefix=".pause.") as tmp:
        binary = Path(tmp) / "pause"
        _run(["gcc", *PAUSE_CFLAGS, "-o", binary, src], "pause: gcc")
        _run(["strip", binary], "pause: strip")
        with b.container("scratch", PAUSE_REF) as ctr:
            b("copy", "--chmod", "0755", ctr, binary, "/pause", what=f"{PAUSE_REF}: copy")
            b(
                "config",
                "--entrypoint",
                '["/pause"]',
                "--user",
                "65535:65535",
                "--os",
                "linux",
                "--arch",
                "amd64",
                ctr,
                what=f"{PAUSE_REF}: config",
            )
            image_id = b("commit", "--quiet", ctr, PAUSE_REF, what=f"{PAUSE_REF}: commit")
    return _store(b, slot, image_id, time.monotonic() - t0, inputs)


def _check_tools() -> None:
    missing = [t for t in ("buildah", "mmdebstrap", "skopeo", "gcc", "go") if shutil.which(t) is None]
    if missing:
        raise ImageError(
            f"missing {' '.join(missing)}: apt-get install buildah mmdebstrap skopeo gcc libc6-dev "
            "(and Go for pause.c from the module cache)"
        )


def build_images(
    repo: Path,
    cache_root: Path = DEFAULT_CACHE_ROOT,
    tags: Sequence[str] = ("0.1.0",),
    multus: tuple[Path, str] | None = None,
) -> list[Image]:
    """Every image the cluster pulls: the base, ``rdma-cni:<tag>`` for each of ``tags`` (from one
    bundle), the test image and pause, in that order, then upstream Multus's when ``multus`` gives
    its build's bin dir and version; built only when not cached (module docstring)."""
    if not tags:
        raise ValueError("build_images: no rdma-cni tag")
    _check_tools()
    repo = repo.resolve()
    b = Buildah(cache_root)
    t0 = time.monotonic()
    with _locked(cache_root / "images" / ".lock"):
        base = build_base(b, cache_root)
        product = build_product(b, repo, cache_root, base, tags)
        test = build_test_image(b, cache_root, base)
        pause = build_pause(b, cache_root)
        images = [base.image(), *product, test, pause]
        if multus is not None:
            images.append(build_multus(b, cache_root, base, *multus))
        for n, img in enumerate(images):
            if img.oci_layout is None:  # cached by a version that saved only the archive
                _oci_layout(img.archive, img.archive.parent / "oci")
                images[n] = Image(img.ref, img.archive, img.archive.parent / "oci")
        if b.dirty:
            b.rmi("--prune")  # e.g. the previous base, untagged by a new one
        _prune(cache_root, images)
    log.info("%d images ready in %.1f s", len(images), time.monotonic() - t0)
    return images


def release_image(
    repo: Path,
    cache_root: Path,
    tag: str,
    labels: dict[str, str],
    dest: Path,
    extract: Sequence[str] = (),
) -> Image:
    """``rdma-cni:<tag>`` exactly as :func:`build_images` makes and caches it, plus ``labels``, saved
    as ``dest/image.tar`` and ``dest/oci/`` (what scripts/release pushes); each path of ``extract``
    (relative to the image's /) is copied out to ``dest/rootfs/``, so the release's bundle tarball and
    SBOM are made of the very files the image holds. The labels go on in a commit of their own (no
    layer), outside the cache: a release's build time and commit never rebuild the bundle."""
    repo = repo.resolve()
    b = Buildah(cache_root)
    ref = f"{PRODUCT_REPO}:{tag}"
    with _locked(cache_root / "images" / ".lock"):
        base = build_base(b, cache_root)
        (cached,) = build_product(b, repo, cache_root, base, (tag,))
        loaded = b.load(cached.archive, ref)
        try:
            with b.container(ref, ref) as ctr:
                args = [a for k, v in sorted(labels.items()) for a in ("--label", f"{k}={v}")]
                b("config", *args, ctr, what=f"{ref}: release labels")
                _copy_out(b, ctr, extract, dest / "rootfs")
                b("commit", "--quiet", ctr, ref, what=f"{ref}: commit")
            b.save(ref, dest / "image.tar")
        finally:
            b.rmi(ref)
            b.rmi(loaded)  # the cached image the labelled one was made from, untagged by its commit
    _oci_layout(dest / "image.tar", dest / "oci")
    return Image(ref, dest / "image.tar", dest / "oci")


def _copy_out(b: Buildah, ctr: str, paths: Sequence[str], dest: Path) -> None:
    """Copy ``paths`` of the working container's filesystem to ``dest`` (symlinks kept as links)."""
    if not paths:
        return
    root = Path(b("mount", ctr, what=f"{ctr}: mount"))
    try:
        for rel in paths:
            src, out = root / rel.lstrip("/"), dest / rel.lstrip("/")
            out.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir() and not src.is_symlink():
                shutil.copytree(src, out, symlinks=True)
            else:
                shutil.copy2(src, out, follow_symlinks=False)
    finally:
        b("umount", ctr, what=f"{ctr}: umount")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cluster.images --repo R --cache C [--tag T ...]``: build (or find) every image and
    print one ``ref archive`` line each."""
    p = argparse.ArgumentParser(
        prog="python -m cluster.images", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE_ROOT)
    p.add_argument("--tag", action="append", dest="tags", help="rdma-cni tag (repeatable; default 0.1.0)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="images: %(message)s", stream=sys.stderr
    )
    try:
        images = build_images(args.repo, args.cache, tuple(args.tags or ("0.1.0",)))
    except ImageError as e:
        print(f"images: {e}", file=sys.stderr)
        return 1
    for img in images:
        print(img.ref, img.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
