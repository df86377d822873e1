"""The README's two commands work as root without sudo and as a user with sudo (scripts/lib.sh).

The scripts are copied into a throw-away tree so a test can give it a fake ``.venv`` or a fake
``sudo`` without touching the checkout; they run as real processes, as root and as ``nobody``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
TOOLS = ("bash", "sh", "id", "dirname", "basename", "cat", "env", "python3")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runs the scripts as nobody)")


@pytest.fixture
def tree() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="h2-scripts-"))
    try:
        os.chmod(top, 0o755)
        (top / "repo" / "scripts").mkdir(parents=True)
        for name in ("lib.sh", "test", "demo", "setup"):
            shutil.copy2(REPO / "scripts" / name, top / "repo" / "scripts" / name)
        bin_dir = top / "bin"
        bin_dir.mkdir()
        for tool in TOOLS:  # a PATH with exactly these tools: no sudo unless a test adds one
            found = shutil.which(tool)
            assert found, tool
            (bin_dir / tool).symlink_to(found)
        for path in [top, *top.rglob("*")]:
            os.chmod(path, 0o755)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _run(tree: Path, script: str, *args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(tree / "repo" / "scripts" / script), *args]
    if user is not None:
        setpriv = shutil.which("setpriv") or "setpriv"
        cmd = [setpriv, f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    env = {"PATH": str(tree / "bin"), "HOME": str(tree)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30, check=False)


@pytest.mark.parametrize("script", ["setup", "demo", "test"])
def test_a_user_without_sudo_is_told_to_run_it_as_root(tree: Path, script: str) -> None:
    proc = _run(tree, script, user=NOBODY)
    assert proc.returncode == 1
    want = f"{script}: needs root (network namespaces) and sudo is not installed: run it as root"
    assert want in proc.stderr


@pytest.mark.parametrize("script", ["setup", "demo", "test"])
def test_a_user_with_sudo_is_re_run_through_sudo_with_the_same_arguments(tree: Path, script: str) -> None:
    record = tree / "sudo-argv"
    sudo = tree / "bin" / "sudo"
    sudo.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    os.chmod(sudo, 0o755)
    os.chmod(tree, 0o777)  # nobody writes the record
    proc = _run(tree, script, "-x", "a b", user=NOBODY)
    assert proc.returncode == 0, proc.stderr
    argv = record.read_text().splitlines()
    assert argv == ["--preserve-env=PYTHON,TMPDIR", str(tree / "repo" / "scripts" / script), "-x", "a b"]


def test_scripts_test_runs_pytest_with_the_projects_venv_first_on_path(tree: Path) -> None:
    venv_bin = tree / "repo" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    fake = venv_bin / "python"
    fake.write_text('#!/bin/sh\necho "argv: $*"\necho "path: $PATH"\n')
    os.chmod(fake, 0o755)
    proc = _run(tree, "test")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "argv: -m pytest -q"
    assert lines[1].startswith(f"path: {venv_bin}:")
    proc = _run(tree, "test", "-x", "tests/core/test_state.py")
    assert proc.stdout.splitlines()[0] == "argv: -m pytest -x tests/core/test_state.py"


def test_without_a_venv_the_scripts_use_python3_as_it_is(tree: Path) -> None:
    proc = subprocess.run(
        ["bash", "-c", f". {tree}/repo/scripts/lib.sh; project_python"],
        capture_output=True, text=True, env={"PATH": str(tree / "bin")}, check=True,
    )
    assert proc.stdout.strip() == "python3"
