"""scripts/release end to end, everything real: a clean clone of this repository's HEAD releases
0.1.0 into go-containerregistry's registry (``crane registry serve`` on 127.0.0.1, a free port, as
the test cluster's harness starts it), then everything is pulled back: the image's labels (crane
config), the chart (helm show chart / values, helm pull), SHA256SUMS (sha256sum -c), the bundle
tarball (its program runs), the SBOMs (CycloneDX schema, what they list) and releases.json. Refused
releases (not SemVer, no CHANGELOG entry, already released) push nothing.

The image is the test cluster's build (cluster.images, cached by the clone's content: a second run
of the same HEAD builds nothing); the clone uses this checkout's .venv, as scripts/setup made it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import release_support as support
import yaml
from cluster import chart as cluster_chart
from cluster import images as im
from cluster import registry as reg

pytestmark = [pytest.mark.helm]

REPO = support.REPO
VERSION = support.VERSION
release = support.release


def _missing() -> str:
    if os.geteuid() != 0:
        return "needs root (buildah builds the image)"
    tools = [t for t in ("buildah", "mmdebstrap", "skopeo", "git", "sha256sum") if shutil.which(t) is None]
    if tools:
        return f"missing {' '.join(tools)}"
    try:
        cluster_chart.helm()
    except Exception as e:  # noqa: BLE001 - the message is the reason to skip
        return str(e)
    return ""


@dataclass
class Registry:
    addr: str
    bins: reg.RegistryBins

    def crane(self, *args: str) -> str:
        return reg.crane(self.bins, *args)

    def catalog(self) -> list[str]:
        return self.crane("catalog", "--insecure", self.addr).split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry of this module's own on 127.0.0.1, stopped by its pid afterwards."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    bins = reg.build_registry(im.DEFAULT_CACHE_ROOT)
    addr = f"127.0.0.1:{_free_port()}"
    proc = reg.start_registry(bins, addr, tmp_path_factory.mktemp("registry") / "disk")
    try:
        yield Registry(addr, bins)
    finally:
        reg.stop_registry(proc)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    return support.clone(tmp_path_factory.mktemp("release"))


def helm(tmp: Path, *args: str) -> str:
    env = dict(os.environ, HELM_CACHE_HOME=str(tmp / "hc"), HELM_CONFIG_HOME=str(tmp / "hcfg"))
    proc = subprocess.run([cluster_chart.helm(), *args], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@dataclass
class Released:
    clone: Path
    out: Path
    registry: Registry
    proc: subprocess.CompletedProcess[str]

    @property
    def path(self) -> str:
        return f"{self.registry.addr}/rdma"


@pytest.fixture(scope="module")
def refused(clone: Path, registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The refused releases, run first, against the empty registry: each one's stderr."""
    out = tmp_path_factory.mktemp("refused") / "out"
    errors = {}
    for version in ("1.2", "v0.1.0", "0.9.9"):
        proc = release(clone, version, "--registry", f"{registry.addr}/rdma", "--insecure", "--out", str(out))
        assert proc.returncode == 1, proc.stderr
        errors[version] = proc.stderr
    assert registry.catalog() == []
    assert not out.exists()
    return errors


@pytest.fixture(scope="module")
def released(
    refused: dict[str, str], clone: Path, registry: Registry, tmp_path_factory: pytest.TempPathFactory
) -> Released:
    out = tmp_path_factory.mktemp("released") / "out"
    proc = release(clone, VERSION, "--registry", f"{registry.addr}/rdma", "--insecure", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-6000:]
    return Released(clone, out, registry, proc)


def test_a_version_that_is_not_semver_is_refused_and_nothing_is_pushed(refused: dict[str, str]) -> None:
    assert "'1.2' is not a SemVer 2.0.0 version" in refused["1.2"]
    assert "'v0.1.0' is not a SemVer 2.0.0 version" in refused["v0.1.0"]


def test_a_version_without_a_changelog_entry_is_refused_and_nothing_is_pushed(
    refused: dict[str, str],
) -> None:
    assert "CHANGELOG.md has no entry '## [0.9.9]'" in refused["0.9.9"]
    assert "Traceback" not in refused["0.9.9"]


def test_the_image_carries_the_release_labels(released: Released) -> None:
    config = json.loads(
        released.registry.crane("config", "--insecure", f"{released.path}/rdma-cni:{VERSION}")
    )
    labels = config["config"]["Labels"]
    commit = subprocess.run(
        ["git", "-C", str(released.clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.revision"] == commit
    assert labels["org.opencontainers.image.source"] == str(REPO)
    created = labels["org.opencontainers.image.created"]
    assert created.endswith("Z") and created[:4].isdigit()
    assert config["config"]["Entrypoint"] == ["/opt/rdma-cni/install.sh"]


def test_the_chart_pulled_back_is_the_version_and_names_the_registrys_image(
    released: Released, tmp_path: Path
) -> None:
    oci = f"oci://{released.path}/charts/rdma-cni"
    meta = yaml.safe_load(helm(tmp_path, "show", "chart", oci, "--version", VERSION, "--plain-http"))
    assert meta["name"] == "rdma-cni" and meta["version"] == VERSION and meta["appVersion"] == VERSION
    values = yaml.safe_load(helm(tmp_path, "show", "values", oci, "--version", VERSION, "--plain-http"))
    assert values["image"]["repository"] == f"{released.path}/rdma-cni"
    helm(tmp_path, "pull", oci, "--version", VERSION, "--plain-http", "-d", str(tmp_path))
    pulled = (tmp_path / f"rdma-cni-{VERSION}.tgz").read_bytes()
    assert pulled == (released.out / f"rdma-cni-{VERSION}.tgz").read_bytes()
    rendered = helm(tmp_path, "template", "rdma-cni", str(tmp_path / f"rdma-cni-{VERSION}.tgz"))
    assert f"image: {released.path}/rdma-cni:{VERSION}" in rendered


def test_sha256sums_verifies_every_artifact(released: Released) -> None:
    names = sorted(p.name for p in released.out.iterdir())
    assert names == sorted(
        [
            "SHA256SUMS",
            f"rdma-cni-{VERSION}.tgz",
            f"rdma-cni-{VERSION}-linux-amd64.tar.gz",
            f"rdma-cni-{VERSION}-bundle.cdx.json",
            f"rdma-cni-{VERSION}-image.cdx.json",
        ]
    )
    proc = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=released.out, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": OK") == 4


def test_the_bundle_tarball_is_the_images_bundle_and_runs(released: Released, tmp_path: Path) -> None:
    with tarfile.open(released.out / f"rdma-cni-{VERSION}-linux-amd64.tar.gz") as tar:
        assert {m.uid for m in tar.getmembers()} == {0}
        tar.extractall(tmp_path, filter="tar")
    bundle = tmp_path / "rdma-cni"
    assert (bundle / "BUILD_ID").read_text().startswith(f"{VERSION}-")
    assert os.readlink(bundle / "cni-tool") == "rdma-cni"
    proc = subprocess.run([str(bundle / "rdma-cni"), "cni-tool", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _bom(released: Released, which: str) -> dict[str, object]:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text = (released.out / f"rdma-cni-{VERSION}-{which}.cdx.json").read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    bom: dict[str, object] = json.loads(text)
    return bom


def _names(bom: dict[str, object]) -> dict[str, str]:
    components = bom["components"]
    assert isinstance(components, list)
    return {c["name"]: c.get("version", "") for c in components}


def test_the_bundle_sbom_lists_what_the_bundle_froze(released: Released) -> None:
    import importlib.metadata

    bom = _bom(released, "bundle")
    root = bom["metadata"]["component"]  # type: ignore[index]
    assert root["name"] == "rdma-cni" and root["version"] == VERSION
    names = _names(bom)
    assert names["grpcio"] == importlib.metadata.version("grpcio")
    assert {"pyroute2", "protobuf", "PyYAML", "click", "cpython"} <= names.keys()
    assert not {"pytest", "mypy", "grpcio-tools", "rdma-cni"} & names.keys()  # not frozen into it


def test_the_image_sbom_adds_the_images_debian_packages(released: Released) -> None:
    bom = _bom(released, "image")
    root = bom["metadata"]["component"]  # type: ignore[index]
    digest = released.registry.crane("digest", "--insecure", f"{released.path}/rdma-cni:{VERSION}").strip()
    assert root["type"] == "container" and digest.replace(":", "%3A") in root["purl"]
    names = _names(bom)
    assert names["rdma-cni"] == VERSION and "grpcio" in names
    assert {"bash", "libc6", "coreutils"} <= names.keys()


def test_releases_json_records_the_commit_and_the_pushed_digests(released: Released) -> None:
    (entry,) = json.loads((released.clone / "releases.json").read_text())
    head = subprocess.run(
        ["git", "-C", str(released.clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert entry["version"] == VERSION and entry["commit"] == head
    digest = released.registry.crane("digest", "--insecure", f"{released.path}/rdma-cni:{VERSION}").strip()
    assert entry["image"] == f"{released.path}/rdma-cni@{digest}"
    assert entry["chart"].startswith(f"oci://{released.path}/charts/rdma-cni:{VERSION}@sha256:")


def test_a_released_version_is_never_released_again(released: Released, tmp_path: Path) -> None:
    before = released.registry.crane("digest", "--insecure", f"{released.path}/rdma-cni:{VERSION}")
    proc = release(
        released.clone, VERSION, "--registry", released.path, "--insecure", "--out", str(tmp_path / "o")
    )
    assert proc.returncode == 1
    assert f"{VERSION} was released from" in proc.stderr
    assert released.registry.crane("digest", "--insecure", f"{released.path}/rdma-cni:{VERSION}") == before
