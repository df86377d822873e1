"""The CNI protocol core: ``run(env, stdin, spec) -> (stdout, exit_code)``, a pure function.

It reads nothing but its arguments and writes nothing but its return value (and logs), so tests call
it with a dict and bytes, and a warm node agent can serve many requests from one process. This is the
only place where an exception becomes the error JSON on stdout.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping

from rdma_cni import __version__
from rdma_cni.cni import version as cniver
from rdma_cni.cni.errors import INVALID_ENV, IO_FAILURE, CniError
from rdma_cni.cni.netns_guard import refuse_own_netns
from rdma_cni.cni.plugin import PluginSpec
from rdma_cni.cni.request import VERBS, Request, parse_request
from rdma_cni.cni.result import render

log = logging.getLogger("rdma_cni")

INTERNAL_ERROR = 999  # a bug: docs/troubleshooting.md says "report it with the log"


def run(env: Mapping[str, str], stdin: bytes, spec: PluginSpec) -> tuple[str, int]:
    """Execute one CNI invocation. stdout carries the result or the error JSON; never raises."""
    command = env.get("CNI_COMMAND", "")
    if not command:
        sys.stderr.write(about_text(spec))
        return "", 0
    try:
        if command not in VERBS:
            raise CniError(INVALID_ENV, f"unknown CNI_COMMAND {command!r}: expected one of {list(VERBS)}")
        if command == "VERSION":
            return _version_answer(stdin), 0
        req = parse_request(env, stdin, command, spec.known_args)
        refuse_own_netns(command, env)
        return _execute(req, spec), 0
    except CniError as err:
        log.warning("%s %s failed: code %d: %s", spec.name, command, err.code, err.msg)
        return _error_json(err, _error_version(stdin)), 1
    except OSError as exc:
        log.exception("%s %s: I/O failure", spec.name, command)
        return _error_json(CniError(IO_FAILURE, f"I/O failure: {exc}"), _error_version(stdin)), 1
    except Exception as exc:  # the runtime must always get JSON, even for a bug
        log.exception("%s %s: internal error", spec.name, command)
        msg = f"internal error ({type(exc).__name__}: {exc}); see the plugin log"
        return _error_json(CniError(INTERNAL_ERROR, msg), _error_version(stdin)), 1


def _execute(req: Request, spec: PluginSpec) -> str:
    plugin = spec.factory()
    if req.command == "ADD":
        return json.dumps(render(plugin.add(req), req.cni_version))
    if req.command == "DEL":
        plugin.delete(req)
    elif req.command == "CHECK":
        plugin.check(req)
    elif req.command == "GC":
        plugin.gc(req)
    elif req.command == "STATUS":
        plugin.status(req)
    return ""


def _version_answer(stdin: bytes) -> str:
    """SPEC "Version": ``cniVersion`` is the one given on input; VERSION never fails on bad stdin."""
    asked = _input_version(stdin)
    valid = asked is not None and _is_semver(asked)
    answer = asked if valid else cniver.CURRENT
    return json.dumps({"cniVersion": answer, "supportedVersions": list(cniver.SUPPORTED)})


def _input_version(stdin: bytes) -> str | None:
    try:
        value = json.loads(stdin).get("cniVersion")
    except Exception:  # noqa: BLE001 - undecodable stdin simply has no version
        return None
    return value if isinstance(value, str) else None


def _is_semver(value: str) -> bool:
    try:
        cniver.parse(value)
    except ValueError:
        return False
    return True


def _error_version(stdin: bytes) -> str:
    """The config's cniVersion when it is one we speak, else the newest (what skel does)."""
    value = _input_version(stdin)
    return value if value is not None and cniver.is_supported(value) else cniver.CURRENT


def _error_json(err: CniError, cni_version: str) -> str:
    return json.dumps(err.to_dict(cni_version))


def about_text(spec: PluginSpec) -> str:
    versions = ", ".join(cniver.SUPPORTED)
    about = spec.about or f"{spec.name}: a CNI plugin of rdma-cni"
    return f"{about}\nrdma-cni {__version__}; CNI protocol versions {versions}\n"
