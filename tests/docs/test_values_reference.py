"""docs/values.md is generated from the chart (scripts/gen-values-reference): it must be what the
chart's values.yaml and values.schema.json give today, and the check must catch a stale page."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.docs

REPO = Path(__file__).resolve().parents[2]
GEN = REPO / "scripts" / "gen-values-reference"
CHART = REPO / "charts" / "rdma-cni"


def gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GEN), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_the_values_page_is_what_the_chart_gives() -> None:
    proc = gen("--check")
    assert proc.returncode == 0, proc.stderr + "run: scripts/gen-values-reference"


def _paths(value: Any, path: str = "", depth: int = 2) -> list[str]:
    """Every key of values.yaml down to ``depth`` levels (``metrics``, ``metrics.port`` …)."""
    out = [path] if path else []
    if isinstance(value, dict) and depth:
        for k, v in value.items():
            out += _paths(v, f"{path}.{k}" if path else k, depth - 1)
    return out


def test_every_value_of_the_chart_has_a_row_with_its_default() -> None:
    page = (REPO / "docs" / "values.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    for path in _paths(values):
        if path == "nodeSelector" or path.startswith("nodeSelector."):
            continue  # a map of labels: one row for the whole map
        assert any(r.startswith(f"| `{path}`") or r.startswith(f"| `{path}.") for r in rows), path
    assert f"## `{next(iter(values))}`" in page
    assert "| `rdmaMode` | <code>exclusive</code> | <code>exclusive</code> or <code>shared</code> |" in page
    assert "| `metrics.port` | <code>9513</code> |" in page


def test_a_changed_default_or_schema_makes_the_page_stale(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text((CHART / "values.yaml").read_text().replace("port: 9513", "port: 9514"))
    proc = gen("--check", "--values", str(values))
    assert proc.returncode == 1 and "stale" in proc.stderr, proc.stdout + proc.stderr
    schema = tmp_path / "values.schema.json"
    shutil.copy(CHART / "values.schema.json", schema)
    schema.write_text(schema.read_text().replace('"enum": ["exclusive", "shared"]', '"enum": ["exclusive"]'))
    proc = gen("--check", "--schema", str(schema))
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_the_generator_writes_the_page_it_checks(tmp_path: Path) -> None:
    out = tmp_path / "values.md"
    assert gen("--out", str(out)).returncode == 0
    assert out.read_text() == (REPO / "docs" / "values.md").read_text()
    assert gen("--check", "--out", str(out)).returncode == 0
