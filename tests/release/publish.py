"""scripts/release: one command makes a release of rdma-cni and pushes it to a registry.

    scripts/release VERSION --registry HOST[:PORT][/PATH] [--insecure] [--out DIR] [--source URL]

Refused before anything is built or pushed, each with one sentence that says what to fix: a VERSION
that is not SemVer 2.0.0; one with no entry in CHANGELOG.md, or whose entry has no Compatibility
section; one that rdma_cni/__init__.py, pyproject.toml and charts/rdma-cni/Chart.yaml (version and
appVersion) do not all say; one releases.json already lists; a working tree with changes (the image's
revision label names the commit, which must be what was built); an out dir that is not empty.

Made in OUT (default dist/release-VERSION/):

    rdma-cni-VERSION-linux-amd64.tar.gz  the node bundle (rdma-cni/, as docs/install-bundle.md
                                         installs it): the very files the image holds
    rdma-cni-VERSION.tgz                 the chart (helm package); its image.repository is
                                         REGISTRY/rdma-cni, so the chart pulls the image it came with
    rdma-cni-VERSION-bundle.cdx.json     CycloneDX SBOMs of the bundle and of the image (sbom.py)
    rdma-cni-VERSION-image.cdx.json
    SHA256SUMS                           of the four: sha256sum -c SHA256SUMS

Pushed: REGISTRY/rdma-cni:VERSION, the image the test cluster's harness builds (cluster.images,
cached by the checkout's content) with the labels org.opencontainers.image.{version,revision,source,
created}, by crane; oci://REGISTRY/charts/rdma-cni:VERSION, by helm push (--plain-http with
--insecure, which crane gets too). Credentials are the clients' own (crane auth login, helm registry
login). Last, releases.json gets the version, its commit and the pushed digests: commit it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gzip
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sbom
import yaml
from cluster import chart as cluster_chart
from cluster import images, registry
from cluster.build import BuildError
from cluster.buildah import ImageError

REPO = Path(__file__).resolve().parents[2]
# https://semver.org/#is-there-a-suggested-regular-expression-regex-to-check-a-semver-string
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
REGISTRY = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
IMAGE = "rdma-cni"
CHARTS = "charts"
LABEL = "org.opencontainers.image."
IN_IMAGE_BUNDLE = "opt/rdma-cni/bundle"
IN_IMAGE_DPKG = "var/lib/dpkg/status"


class ReleaseError(RuntimeError):
    """The release cannot go on: the message is one sentence for the person releasing."""


@dataclass(frozen=True)
class Release:
    """What one release is: its version, where it goes, and what it is built from."""

    version: str
    registry: str
    insecure: bool
    out: Path
    repo: Path
    commit: str
    source: str
    created: str  # RFC 3339, UTC: the image's created label and the SBOMs' timestamp

    @property
    def image_ref(self) -> str:
        return f"{self.registry}/{IMAGE}:{self.version}"

    @property
    def chart_oci(self) -> str:
        return f"oci://{self.registry}/{CHARTS}"

    def name(self, suffix: str) -> Path:
        return self.out / f"rdma-cni-{self.version}{suffix}"


# ---- the checks ---------------------------------------------------------------------------------


def check_semver(version: str) -> None:
    if not SEMVER.fullmatch(version):
        raise ReleaseError(
            f"{version!r} is not a SemVer 2.0.0 version (MAJOR.MINOR.PATCH, e.g. 0.1.0 or 1.2.0-rc.1)"
        )


def check_registry(value: str) -> None:
    if not REGISTRY.fullmatch(value):
        raise ReleaseError(
            f"--registry {value!r}: give HOST[:PORT][/PATH], e.g. registry.example.com:5000/rdma"
        )


def changelog_entry(repo: Path, version: str) -> str:
    """The CHANGELOG.md entry of ``version`` (``## [VERSION]`` to the next ``## ``); it must say
    what to check before upgrading (``### Compatibility``)."""
    path = repo / "CHANGELOG.md"
    text = path.read_text() if path.is_file() else ""
    m = re.search(rf"^## \[{re.escape(version)}\][^\n]*\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    if m is None:
        raise ReleaseError(f"CHANGELOG.md has no entry '## [{version}]': write what {version} changes first")
    if not re.search(r"^### Compatibility\s*\n\s*\S", m.group(1), re.MULTILINE):
        raise ReleaseError(f"CHANGELOG.md's entry of {version} has no '### Compatibility' notes")
    return m.group(1).strip()


def declared_versions(repo: Path) -> dict[str, str]:
    """Where the checkout states its version -> what each says."""
    init = (repo / "rdma_cni" / "__init__.py").read_text()
    pyproject = (repo / "pyproject.toml").read_text()
    chart = yaml.safe_load((repo / "charts" / "rdma-cni" / "Chart.yaml").read_text())
    found = {
        "rdma_cni/__init__.py": re.search(r'^__version__ = "([^"]*)"', init, re.MULTILINE),
        "pyproject.toml": re.search(r'^version = "([^"]*)"', pyproject, re.MULTILINE),
    }
    out = {k: m.group(1) if m else "(none)" for k, m in found.items()}
    out["charts/rdma-cni/Chart.yaml version"] = str(chart.get("version"))
    out["charts/rdma-cni/Chart.yaml appVersion"] = str(chart.get("appVersion"))
    return out


def check_declared(repo: Path, version: str) -> None:
    wrong = {k: v for k, v in declared_versions(repo).items() if v != version}
    if wrong:
        says = ", ".join(f"{k} says {v}" for k, v in wrong.items())
        raise ReleaseError(f"releasing {version} but {says}: set every one to {version} and commit")


def released(repo: Path) -> list[dict[str, str]]:
    path = repo / "releases.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ReleaseError("releases.json is not a list of releases")
    return data


def check_unreleased(repo: Path, version: str) -> None:
    for r in released(repo):
        if r.get("version") == version:
            raise ReleaseError(
                f"{version} was released from {r.get('commit')} on {r.get('created')}: "
                "a released version is never rebuilt, release the next one"
            )


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def check_clean(repo: Path) -> None:
    changed = git(repo, "status", "--porcelain", "--untracked-files=normal")
    if changed:
        first = changed.splitlines()[0]
        raise ReleaseError(
            f"the working tree has changes ({first!r} and {len(changed.splitlines()) - 1} more): "
            "a release is built from a commit, commit or remove them (or release from a clean clone)"
        )


def source_url(repo: Path, given: str | None) -> str:
    if given:
        return given
    proc = subprocess.run(
        ["git", "-C", str(repo), "remote", "get-url", "origin"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ReleaseError("no git remote 'origin' to name as the image's source: give --source URL")
    return proc.stdout.strip()


def check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out} is not empty: give an empty or new --out")


def plan(argv: Sequence[str]) -> Release:
    """The command line, checked in the order the module docstring gives; nothing built yet."""
    args = parser().parse_args(argv)
    repo = REPO
    check_semver(args.version)
    check_registry(args.registry)
    changelog_entry(repo, args.version)
    check_declared(repo, args.version)
    check_unreleased(repo, args.version)
    check_clean(repo)
    out = Path(args.out).resolve() if args.out else repo / "dist" / f"release-{args.version}"
    check_out_dir(out)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return Release(
        args.version,
        args.registry.rstrip("/"),
        args.insecure,
        out,
        repo,
        git(repo, "rev-parse", "HEAD"),
        source_url(repo, args.source),
        now,
    )


# ---- the artifacts ------------------------------------------------------------------------------


def labels(r: Release) -> dict[str, str]:
    return {
        f"{LABEL}version": r.version,
        f"{LABEL}revision": r.commit,
        f"{LABEL}source": r.source,
        f"{LABEL}created": r.created,
    }


def arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def bundle_tarball(bundle: Path, dest: Path, epoch: int) -> None:
    """``bundle`` as ``rdma-cni/`` in a gzip tarball, entries sorted, owner root, mtimes the commit's,
    symlinks kept: the same bundle makes the same bytes."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = epoch
        return info

    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=epoch) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for p in [bundle, *sorted(bundle.rglob("*"))]:
                name = "rdma-cni" if p == bundle else f"rdma-cni/{p.relative_to(bundle)}"
                tar.add(p, arcname=name, recursive=False, filter=normalise)


def set_image_repository(values: str, repository: str) -> str:
    """values.yaml's text with the ``image:`` block's ``repository:`` replaced (comments kept)."""
    pattern = re.compile(r"^(image:\n(?:(?:  .*|\s*)\n)*?  repository: ).*$", re.MULTILINE)
    new, count = pattern.subn(lambda m: m.group(1) + repository, values, count=1)
    if count != 1:
        raise ReleaseError("charts/rdma-cni/values.yaml: no image.repository to point at the registry")
    return new


def helm(*args: str) -> str:
    """The test cluster's helm (or $HELM) with the caller's environment: its registry login."""
    try:
        binary = cluster_chart.helm()
    except BuildError as e:
        raise ReleaseError(f"{e}") from e
    proc = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ReleaseError(f"helm {args[0]}: {proc.stderr.strip()[-1500:]}")
    return proc.stdout + proc.stderr


def package_chart(r: Release, work: Path) -> Path:
    """charts/rdma-cni with its image in the registry, packaged at the release's version."""
    chart = work / "chart" / "rdma-cni"
    shutil.copytree(r.repo / "charts" / "rdma-cni", chart)
    values = chart / "values.yaml"
    values.write_text(set_image_repository(values.read_text(), f"{r.registry}/{IMAGE}"))
    helm("lint", "--strict", str(chart))
    helm(
        "package", str(chart), "--version", r.version, "--app-version", r.version, "--destination", str(r.out)
    )
    path = r.name(".tgz")
    if not path.is_file():
        raise ReleaseError(f"helm package made no {path.name}")
    return path


def image_digest(oci_layout: Path) -> str:
    """The manifest digest of the single image of an OCI layout (what the registry will serve)."""
    index = json.loads((oci_layout / "index.json").read_text())
    (manifest,) = index["manifests"]
    return str(manifest["digest"])


def write_sboms(r: Release, rootfs: Path, digest: str) -> None:
    epoch = int(dt.datetime.fromisoformat(r.created.replace("Z", "+00:00")).timestamp())
    bundle = sbom.bundle_bom(rootfs / IN_IMAGE_BUNDLE, r.repo / "pyproject.toml", epoch)
    sbom.write(bundle, r.name("-bundle.cdx.json"), f"{r.version} {r.commit} bundle")
    repo_url = f"{r.registry}/{IMAGE}"
    purl = f"pkg:oci/{IMAGE}@{digest.replace(':', '%3A')}?repository_url={repo_url}&tag={r.version}"
    image = sbom.image_bom(bundle, (rootfs / IN_IMAGE_DPKG).read_text(), repo_url, r.version, purl)
    sbom.write(image, r.name("-image.cdx.json"), f"{r.version} {r.commit} image")


def write_sums(out: Path) -> Path:
    """SHA256SUMS of every file in ``out``, as ``sha256sum`` writes and checks them."""
    lines = []
    for f in sorted(p for p in out.iterdir() if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n")
    path = out / "SHA256SUMS"
    path.write_text("".join(lines))
    return path


def build(r: Release, work: Path) -> images.Image:
    """Every artifact into r.out; the labelled image under ``work`` (not pushed yet)."""
    r.out.mkdir(parents=True, exist_ok=True)
    print(f"release {r.version}: the image (the bundle's build, cached by content) ...", file=sys.stderr)
    try:
        image = images.release_image(
            r.repo,
            images.DEFAULT_CACHE_ROOT,
            r.version,
            labels(r),
            work / "image",
            extract=(IN_IMAGE_BUNDLE, IN_IMAGE_DPKG),
        )
    except ImageError as e:
        raise ReleaseError(f"the image: {e}") from e
    rootfs = work / "image" / "rootfs"
    epoch = int(git(r.repo, "log", "-1", "--format=%ct"))
    bundle_tarball(rootfs / IN_IMAGE_BUNDLE, r.name(f"-linux-{arch()}.tar.gz"), epoch)
    package_chart(r, work)
    assert image.oci_layout is not None
    print(f"release {r.version}: the SBOMs ...", file=sys.stderr)
    write_sboms(r, rootfs, image_digest(image.oci_layout))
    write_sums(r.out)
    return image


# ---- the pushes ---------------------------------------------------------------------------------


def push_image(r: Release, image: images.Image) -> str:
    """crane push of the image's OCI layout; the pushed reference with its digest."""
    try:
        bins = registry.build_registry(images.DEFAULT_CACHE_ROOT)
    except BuildError as e:
        raise ReleaseError(f"crane: {e}") from e
    assert image.oci_layout is not None
    args = ["push", *(["--insecure"] if r.insecure else []), str(image.oci_layout), r.image_ref]
    try:
        out = registry.crane(bins, *args).strip()
    except registry.RegistryError as e:
        raise ReleaseError(f"pushing the image to {r.image_ref}: {e}") from e
    return out.splitlines()[-1]


def push_chart(r: Release) -> str:
    """helm push of the packaged chart; its reference with the digest the registry gave."""
    out = helm("push", str(r.name(".tgz")), r.chart_oci, *(["--plain-http"] if r.insecure else []))
    m = re.search(r"Digest: (sha256:[0-9a-f]{64})", out)
    if m is None:
        raise ReleaseError(f"helm push gave no digest: {out.strip()[-500:]}")
    return f"{r.chart_oci}/rdma-cni:{r.version}@{m.group(1)}"


def record(r: Release, image_ref: str, chart_ref: str) -> None:
    """Append the release to releases.json (written whole, then renamed)."""
    entries = released(r.repo)
    entries.append(
        {
            "version": r.version,
            "commit": r.commit,
            "created": r.created,
            "image": image_ref,
            "chart": chart_ref,
        }
    )
    path = r.repo / "releases.json"
    tmp = path.with_name(".releases.json.tmp")
    tmp.write_text(json.dumps(entries, indent=2) + "\n")
    os.replace(tmp, path)


def release(r: Release) -> None:
    """Build everything in a scratch dir, move the files into r.out only once all are made (a failed
    build leaves no half release there), then push and record."""
    with tempfile.TemporaryDirectory(prefix="rdma-cni-release.") as tmp:
        staged = dataclasses.replace(r, out=Path(tmp) / "out")
        image = build(staged, Path(tmp))
        r.out.mkdir(parents=True, exist_ok=True)
        for f in sorted(staged.out.iterdir()):
            shutil.move(f, r.out / f.name)
        image_ref = push_image(r, image)
        print(f"release {r.version}: pushed {image_ref}", file=sys.stderr)
        chart_ref = push_chart(r)
        print(f"release {r.version}: pushed {chart_ref}", file=sys.stderr)
    record(r, image_ref, chart_ref)
    print(
        f"release {r.version}: {r.out} (sha256sum -c SHA256SUMS there); commit releases.json", file=sys.stderr
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/release", description="Release rdma-cni: image, chart, bundle.")
    p.add_argument("version", help="SemVer 2.0.0, with a CHANGELOG.md entry")
    p.add_argument(
        "--registry", required=True, help="HOST[:PORT][/PATH]: image PATH/rdma-cni, chart PATH/charts"
    )
    p.add_argument("--insecure", action="store_true", help="plain HTTP to the registry")
    p.add_argument("--out", help="where the files go (default dist/release-VERSION)")
    p.add_argument("--source", help="the image's source label (default: git remote origin's URL)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        r = plan(sys.argv[1:] if argv is None else argv)
        release(r)
    except (ReleaseError, sbom.SbomError) as e:
        print(f"release: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
