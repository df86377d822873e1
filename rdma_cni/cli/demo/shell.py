"""What every step of the demo uses: run a command and show it, fail with one sentence, and clean up
after runs that were killed.

Names carry ``h6-demo-<pid>``; everything is removed on exit, on failure and on Ctrl-C, and a later
run also removes what a killed run left (its pid is gone).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

REPO = Path(__file__).resolve().parents[3]
PREFIX = "h6-demo-"


class DemoFailed(Exception):
    """A step did not do what the demo shows; the message says which and why."""



def say(text: str = "") -> None:
    print(text, flush=True)


def banner(step: str) -> None:
    say()
    say(f"=== {step} " + "=" * max(0, 96 - len(step)))


def run(
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
    show: bool = False,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    if show:
        say(f"$ {' '.join(args)}")
    proc = subprocess.run(
        list(args), capture_output=True, text=True, env=env, input=stdin, timeout=120, check=False
    )
    if show and proc.stdout.strip():
        say(proc.stdout.rstrip())
    if check and proc.returncode != 0:
        raise DemoFailed(
            f"`{' '.join(args)}` failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
        )
    return proc


def process_alive(pid: int) -> bool:
    """Whether ``pid`` still runs. A killed process keeps its /proc entry as a zombie (state Z, or X
    while being reaped) until its parent - PID 1 once orphaned, which may take a while - reaps it;
    it will never clean up again, so it counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rpartition(")")[2].split()[:1]  # comm may hold spaces and ")": state follows the last one
    return state not in (["Z"], ["X"], [])


def _dead_run(name: str) -> bool:
    pid = name.removeprefix(PREFIX).split("-")[0]
    return name.startswith(PREFIX) and pid.isdigit() and not process_alive(int(pid))


def sweep_leftovers() -> None:
    """Remove namespaces and dirs of earlier demo runs whose process is gone (kill -9, power loss)."""
    for name in sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []:
        if _dead_run(name):
            run("ip", "netns", "del", name, check=False)
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if _dead_run(path.name):
            shutil.rmtree(path, ignore_errors=True)


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM cleans up like Ctrl-C does."""
    raise KeyboardInterrupt


def show_logs(log_dir: Path) -> None:
    for log in sorted(log_dir.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-15:]
        say(f"--- last lines of {log.name}:")
        for line in lines:
            say(line)


class Run(Protocol):
    """What :func:`finish` needs of a demo run."""

    tag: str
    tmp: Path

    def cleanup(self) -> None: ...


def finish(d: Run, scenario: Callable[[], None]) -> int:
    """Run ``scenario`` and clean up whatever happens; the exit code (0 OK, 1 failed, 130 interrupted)."""
    started = time.monotonic()
    try:
        scenario()
    except DemoFailed as exc:
        say(f"\ndemo FAILED: {exc}")
        show_logs(d.tmp / "log")
        return 1
    except KeyboardInterrupt:
        say("\ndemo interrupted")
        return 130
    finally:
        d.cleanup()
        say(f"\ncleaned up: removed {d.tag}-* namespaces and {d.tmp}")
    say(f"demo OK in {time.monotonic() - started:.1f} s")
    return 0
