"""The bounded fuzz campaign of the suite: every target of tests/fuzz/targets.py under atheris for a
few seconds each (under 60 s in all), from its seeds; any crash or hang fails the test with the
fuzzer's report. ``scripts/fuzz TARGET --minutes N`` runs one for longer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

from tests.fuzz.seeds import SEEDS
from tests.fuzz.targets import TARGETS, structured

pytestmark = [pytest.mark.fuzz, pytest.mark.tenant]

RUN = Path(__file__).with_name("run.py")
SECONDS_EACH = 3  # 9 targets: ~40 s with the interpreters' start


def test_every_target_has_seeds_that_run() -> None:
    assert set(SEEDS) == set(TARGETS)
    for name, seeds in SEEDS.items():
        assert seeds, name
        for seed in seeds:
            TARGETS[name](seed)


def test_structured_inputs_are_json_values_from_the_vocabulary() -> None:
    import atheris

    value = structured(atheris.FuzzedDataProvider(bytes(range(256)) * 4))
    assert value is None or isinstance(value, bool | int | float | str | list | dict)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_bounded_campaign_finds_no_crash(target: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(RUN), target, "--seconds", str(SECONDS_EACH),
                           "--corpus", str(tmp_path / "corpus")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=SECONDS_EACH + 60, check=False)  # fmt: skip
    report = proc.stderr[-4000:]
    assert proc.returncode == 0, report
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("timeout-*")), report
    runs = next(line for line in proc.stderr.splitlines() if line.startswith("Done "))
    print(f"{target}: {runs}")
