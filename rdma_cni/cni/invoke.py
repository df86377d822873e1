"""Running another CNI plugin (IPAM, a meta plugin's delegates, cni-tool's chain) by the protocol.

A plugin ``type`` is a plain name looked up only in the given directories: a name with a path
separator is refused, so a network config can never make us execute an arbitrary file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rdma_cni.cni.errors import DELEGATE_FAILURE, INVALID_CONFIG, CniError

DEFAULT_TIMEOUT = 60.0


def is_plain_name(plugin_type: object) -> bool:
    """A ``type`` that can be looked up at all: a non-empty file name, no path in it."""
    return isinstance(plugin_type, str) and bool(plugin_type) and "/" not in plugin_type and (
        plugin_type not in (".", "..") and "\0" not in plugin_type
    )


def find_plugin(plugin_type: str, dirs: Sequence[str]) -> str:
    if not is_plain_name(plugin_type):
        raise CniError(INVALID_CONFIG, f"plugin type {plugin_type!r} must be a plain executable name")
    for d in dirs:
        candidate = os.path.join(d, plugin_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CniError(
        INVALID_CONFIG,
        f"plugin {plugin_type!r} not found in {list(dirs)}: install it there or fix CNI_PATH/binDir",
    )


def exec_plugin(
    path: str,
    command: str,
    env: Mapping[str, str],
    config: Mapping[str, Any] | bytes,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any] | None:
    """Run ``path`` with ``CNI_COMMAND=command``; return its JSON result (None when it printed nothing).

    A plugin's error JSON becomes a :class:`CniError` with the plugin's own code and message, so the
    runtime sees the delegate's diagnosis, not ours.
    """
    # lazy: ~4 ms of import CPU (python -X importtime) that a cold ADD without an IPAM delegate
    # (rdma-macvlan moving the bond's own addresses) never needs.
    import subprocess

    stdin = config if isinstance(config, bytes) else json.dumps(config).encode()
    full_env = dict(env)
    full_env["CNI_COMMAND"] = command
    name = os.path.basename(path)
    try:
        proc = subprocess.run(
            [path], input=stdin, env=full_env, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise CniError(DELEGATE_FAILURE, f"plugin {name} {command} timed out after {timeout:g}s") from exc
    out = proc.stdout.strip()
    data: Any = None
    if out:
        try:
            data = json.loads(out)
        except ValueError as exc:
            raise CniError(
                DELEGATE_FAILURE, f"plugin {name} {command} printed invalid JSON: {out[:200]!r}"
            ) from exc
    if proc.returncode != 0:
        if isinstance(data, dict) and "code" in data:
            raise CniError(
                int(data.get("code") or DELEGATE_FAILURE),
                f"{name}: {data.get('msg', '')}",
                str(data.get("details", "")),
            )
        stderr = proc.stderr.decode(errors="replace").strip()[-500:]
        raise CniError(DELEGATE_FAILURE, f"plugin {name} {command} exited {proc.returncode}: {stderr}")
    if data is not None and not isinstance(data, dict):
        raise CniError(DELEGATE_FAILURE, f"plugin {name} {command} printed a non-object result")
    return data
