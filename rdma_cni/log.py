"""Logging for plugins whose stdout is the protocol: a log file plus stderr, never stdout.

Entry points call :func:`configure` once the config (``logFile``, ``logLevel``) is known; a log file
that cannot be opened is reported on stderr and otherwise ignored, because a pod start must not fail
for want of a log.
"""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
_configured: set[str] = set()


def configure(log_file: str = "", level: str = "info", stderr_level: str = "warning") -> None:
    root = logging.getLogger("rdma_cni")
    if root.level != logging.DEBUG:  # setLevel walks every logger in the process to clear caches
        root.setLevel(logging.DEBUG)
    root.propagate = False
    if "stderr" not in _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(_level(stderr_level))
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
        _configured.add("stderr")
    if log_file and log_file not in _configured:
        try:
            os.makedirs(os.path.dirname(log_file) or ".", mode=0o700, exist_ok=True)
            file_handler = logging.FileHandler(log_file, delay=True)  # opened by the first record
        except OSError as exc:
            sys.stderr.write(f"rdma-cni: cannot open log file {log_file}: {exc}\n")
            return
        file_handler.setLevel(_level(level))
        file_handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(file_handler)
        _configured.add(log_file)


def _level(name: str) -> int:
    value = logging.getLevelName(name.upper())
    return value if isinstance(value, int) else logging.INFO
