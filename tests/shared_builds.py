"""Expensive read-only things a test run builds once, shared by every pytest-xdist worker.

The first worker to ask builds under an exclusive lock in the run's common temp dir (the parent of
each worker's ``basetemp``); the others wait on that lock and take the result. Without workers it
is just a session-scoped build. Tests only read what is built here (each copies what it changes).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temp dir every worker of this run shares (this process's basetemp without workers)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(dir)`` once per run into ``dir`` (empty, made here); the dir. A build that raised is
    tried again by the next worker that asks (and fails it the same way, with its own message)."""
    shared = run_dir(tmp_path_factory)
    out = shared / f"built-{name}"
    with open(shared / f"built-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = out / ".built"
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            done.touch()
    return out
