"""The documentation: a short README whose first two commands are the setup-and-demo and the tests,
a docs site that mkdocs builds strictly (no broken link or anchor), every page of it rendered by
headless Chromium (a screenshot of the home page kept in the test's directory), the architecture
picture rendered from its source, and no words about how the product was made.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.docs

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_is_short_and_opens_with_the_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    block = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0].startswith("./scripts/setup && ./scripts/demo")
    assert block[1].startswith("./scripts/setup && ./scripts/test")


README_LINK = re.compile(r"\]\(docs/([\w/-]+\.md)(?:#([\w-]+))?\)")


def _nav_pages() -> set[str]:
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    return set(re.findall(r"[\w/-]+\.md", str(nav)))


def test_every_readme_link_to_the_docs_names_a_page_of_the_site() -> None:
    pages = _nav_pages()
    linked = {page for page, _ in README_LINK.findall((REPO / "README.md").read_text())}
    assert linked and linked <= pages, linked - pages


def test_every_page_is_in_the_sites_navigation() -> None:
    """A page left out of mkdocs.yml's nav is built but found by no one."""
    pages = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert pages == _nav_pages(), (pages ^ _nav_pages())


# What a reader must reach from the README in one click: the page (and the section) a link names,
# and words that page must hold to be about that task.
README_TASKS = {
    "install": ("install.md", "", "helm install rdma-cni"),
    "verify": ("install.md", "6-verify", "kubectl describe node"),
    "TKE's test workload and its GID check": ("tke.md", "", "show_gids"),
    "migrate from Multus + Mellanox": ("migrate-mellanox.md", "", "Rollback of phase A"),
    "DRA": ("dra.md", "", "resourceslices"),
    "a stuck pod": ("troubleshooting.md", "", "ContainerCreating"),
    "metrics": ("monitoring.md", "", "/metrics"),
    "uninstall": ("uninstall.md", "", "install.sh --uninstall"),
    "supported versions": ("compatibility.md", "", "untested"),
    "who may create NADs": ("security.md", "who-may-be-given-nad-rights", "NAD rights"),
}


def test_the_readme_reaches_each_task_in_one_click(site: Path) -> None:
    links = set(README_LINK.findall((REPO / "README.md").read_text()))
    for task, (page, anchor, words) in README_TASKS.items():
        assert (page, anchor) in links, f"the README links no {page}{'#' + anchor if anchor else ''} ({task})"
        assert words in (REPO / "docs" / page).read_text(), f"{page} does not say {words!r} ({task})"
        if anchor:
            html = (site / page.removesuffix(".md") / "index.html").read_text()
            assert f'id="{anchor}"' in html, f"{page} has no section #{anchor} ({task})"


def test_no_word_of_how_it_was_made() -> None:
    proc = subprocess.run(["git", "grep", "-n", "-i", "-E", r"the seed|seed 00|this stop|\.\./shared", "--",
                           "README.md", "docs", "charts", "conf"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_mkdocs_builds_the_site_strictly(site: Path) -> None:
    assert (site / "index.html").exists() and (site / "security" / "index.html").exists()


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.skip("Debian's chromium is not installed: run ./scripts/setup")
    return found


def test_every_page_renders_in_headless_chromium(site: Path) -> None:
    chromium = _chromium()
    pages = sorted(site.rglob("index.html"))
    assert len(pages) >= 16, pages
    for page in pages:
        if "search" in page.parts or page.parent.name == "404":
            continue
        proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                               page.as_uri()], capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        heading = re.search(r"<h1[^>]*>(.*?)</h1>", proc.stdout, re.S)
        assert heading and heading.group(1).strip(), f"{page}: no title rendered"
        assert "md-content" in proc.stdout, f"{page}: the theme did not render"
    shot = site / "home.png"
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                           "--window-size=1280,1000", (site / "index.html").as_uri()],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    print(f"home page screenshot: {shot}")


def test_the_architecture_picture_is_what_its_source_renders() -> None:
    dot = shutil.which("dot")
    if dot is None:
        pytest.skip("graphviz's dot is not installed: run ./scripts/setup")
    rendered = subprocess.run([dot, "-Tsvg", str(REPO / "docs/architecture.dot")], capture_output=True,
                              text=True, check=True).stdout
    committed = (REPO / "docs/architecture.svg").read_text()
    strip = re.compile(r"<!-- Generated by graphviz version [^>]*-->")
    assert strip.sub("", rendered) == strip.sub("", committed), "run: dot -Tsvg docs/architecture.dot"
