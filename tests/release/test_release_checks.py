"""scripts/release's refusals and text edits, without a build: the SemVer check, the CHANGELOG entry
and its Compatibility notes, the versions the checkout declares, the released list, the chart's
image.repository rewrite, and the dpkg status the image SBOM reads."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import publish
import pytest
import sbom
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "version", ["0.1.0", "1.2.3", "10.20.30", "1.0.0-rc.1", "1.0.0-alpha.beta+exp.sha.5114f85"]
)
def test_semver_versions_are_accepted(version: str) -> None:
    publish.check_semver(version)


@pytest.mark.parametrize(
    "version", ["1.2", "v1.2.3", "01.2.3", "1.2.3-", "1.2.3.4", "1.2.3-01", "latest", ""]
)
def test_versions_that_are_not_semver_are_refused_naming_semver(version: str) -> None:
    with pytest.raises(publish.ReleaseError, match=r"not a SemVer 2\.0\.0 version"):
        publish.check_semver(version)


def test_the_repositorys_changelog_has_the_declared_version_with_compatibility_notes() -> None:
    (version,) = set(publish.declared_versions(REPO).values())
    entry = publish.changelog_entry(REPO, version)
    assert "### Compatibility" in entry and "### Added" in entry


def test_a_version_without_a_changelog_entry_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "CHANGELOG.md").write_text(
        "# Changelog\n\n## [0.1.0] - 2026-01-01\n\n### Compatibility\n\n- x\n"
    )
    publish.changelog_entry(tmp_path, "0.1.0")
    with pytest.raises(publish.ReleaseError, match=r"CHANGELOG.md has no entry '## \[0.2.0\]'"):
        publish.changelog_entry(tmp_path, "0.2.0")


def test_an_entry_without_compatibility_notes_is_refused(tmp_path: Path) -> None:
    (tmp_path / "CHANGELOG.md").write_text(
        "# Changelog\n\n## [0.2.0] - 2026-02-01\n\n### Added\n\n- y\n\n"
        "## [0.1.0] - 2026-01-01\n\n### Compatibility\n\n- x\n"
    )
    with pytest.raises(publish.ReleaseError, match=r"entry of 0\.2\.0 has no .### Compatibility."):
        publish.changelog_entry(tmp_path, "0.2.0")


def test_a_version_the_checkout_does_not_declare_is_refused_naming_each_file() -> None:
    with pytest.raises(publish.ReleaseError) as e:
        publish.check_declared(REPO, "9.9.9")
    for where in ("rdma_cni/__init__.py", "pyproject.toml", "Chart.yaml version", "Chart.yaml appVersion"):
        assert where in str(e.value)


def test_a_version_releases_json_lists_is_refused(tmp_path: Path) -> None:
    (tmp_path / "releases.json").write_text(
        json.dumps([{"version": "0.1.0", "commit": "abc123", "created": "2026-12-07T00:00:00Z"}])
    )
    publish.check_unreleased(tmp_path, "0.1.1")
    with pytest.raises(publish.ReleaseError, match=r"0\.1\.0 was released from abc123"):
        publish.check_unreleased(tmp_path, "0.1.0")


def test_the_repositorys_releases_json_is_a_list_of_releases() -> None:
    for r in publish.released(REPO):
        assert {"version", "commit", "created", "image", "chart"} <= r.keys()


def test_the_released_chart_names_the_registry_and_changes_nothing_else() -> None:
    text = (REPO / "charts" / "rdma-cni" / "values.yaml").read_text()
    before = yaml.safe_load(text)
    after = yaml.safe_load(publish.set_image_repository(text, "registry.example.com:5000/rdma/rdma-cni"))
    assert after["image"]["repository"] == "registry.example.com:5000/rdma/rdma-cni"
    assert {**after, "image": before["image"]} == before
    registry_host = before["image"]["repository"].split("/")[0]
    assert "." in registry_host or ":" in registry_host  # the default names a registry too


@pytest.mark.parametrize("value", ["127.0.0.1:5000", "registry.example.com/rdma", "reg:5000/a/b-c"])
def test_registry_addresses_are_accepted(value: str) -> None:
    publish.check_registry(value)


@pytest.mark.parametrize("value", ["http://reg:5000", "reg:port", "reg/UPPER", ""])
def test_registry_values_that_are_no_address_are_refused(value: str) -> None:
    with pytest.raises(publish.ReleaseError, match="give HOST"):
        publish.check_registry(value)


def test_dpkg_status_gives_only_installed_packages_with_debian_purls() -> None:
    status = (
        "Package: bash\nStatus: install ok installed\nArchitecture: amd64\nVersion: 5.2.15-2+b7\n"
        "Description: GNU Bourne Again SHell\n more text: with a colon\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1.0\n"
    )
    (bash,) = sbom.dpkg_installed(status)
    assert bash["name"] == "bash" and bash["version"] == "5.2.15-2+b7"
    assert bash["purl"] == "pkg:deb/debian/bash@5.2.15-2+b7?arch=amd64&distro=debian-12"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_working_tree_with_changes_is_refused_naming_the_first(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a").write_text("1\n")
    _git(tmp_path, "add", "a")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "a")
    publish.check_clean(tmp_path)
    (tmp_path / "a").write_text("2\n")
    with pytest.raises(publish.ReleaseError, match="the working tree has changes"):
        publish.check_clean(tmp_path)
    _git(tmp_path, "checkout", "-q", "a")
    (tmp_path / "new").write_text("untracked\n")
    with pytest.raises(publish.ReleaseError, match=r"'\?\? new' and 0 more"):
        publish.check_clean(tmp_path)


def test_an_out_dir_that_holds_files_is_refused(tmp_path: Path) -> None:
    publish.check_out_dir(tmp_path / "new")
    publish.check_out_dir(tmp_path)
    (tmp_path / "old.tgz").write_text("x")
    with pytest.raises(publish.ReleaseError, match="is not empty"):
        publish.check_out_dir(tmp_path)
