"""Turn the runtime's environment and stdin into one validated :class:`Request`.

This is the protocol's input half: which env vars each verb needs (one table, like the reference
plugins' skel), CNI_ARGS with ``IgnoreUnknown``, the network config's ``cniVersion``,
``runtimeConfig``, ``prevResult`` and the GC attachment lists. Everything wrong here is reported with
the spec's code and changes nothing on the host, because no plugin code has run yet.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.cni import version as cniver
from rdma_cni.cni.errors import (
    DECODE_FAILURE,
    INCOMPATIBLE_VERSION,
    INVALID_CONFIG,
    INVALID_ENV,
    UNKNOWN_CONTAINER,
    CniError,
)
from rdma_cni.cni.result import Result
from rdma_cni.cni.result import parse as parse_result

VERBS = ("ADD", "DEL", "CHECK", "VERSION", "GC", "STATUS")

# Which env vars each verb needs (SPEC.md "Parameters"; the reference plugins' skel agrees).
REQUIRED_ENV: dict[str, tuple[str, ...]] = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "GC": ("CNI_PATH",),
    "STATUS": ("CNI_PATH",),
    "VERSION": (),
}

# The first version that has each verb; older configs get error 1 (what skel answers for CHECK).
MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}

# Keys kubelet and containerd put in CNI_ARGS; a plugin may accept more (macvlan: MAC).
STANDARD_ARGS = frozenset(
    {"IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID", "K8S_POD_INFRA_CONTAINER_ID"}
)

MAX_STDIN = 4 * 1024 * 1024
CONTAINER_ID_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
NETWORK_NAME_RE = CONTAINER_ID_RE  # the spec gives network names the same character rule
IFNAME_MAX = 15  # IFNAMSIZ (16) minus the terminating NUL


@dataclass(frozen=True)
class Attachment:
    """One (container, interface) pair: the key of everything a plugin records."""

    container_id: str
    ifname: str


@dataclass
class Request:
    """One CNI call as parsed: its CNI_* environment and the network config read from stdin."""

    command: str
    cni_version: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: dict[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = ()
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    runtime_config: dict[str, Any] = field(default_factory=dict)
    prev_result: Result | None = None
    valid_attachments: tuple[Attachment, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: bytes = b""

    @property
    def attachment(self) -> Attachment:
        return Attachment(self.container_id, self.ifname)


def validate_container_id(value: str) -> None:
    if not value:
        raise CniError(UNKNOWN_CONTAINER, "CNI_CONTAINERID is empty: the runtime must name the container")
    if not CONTAINER_ID_RE.fullmatch(value):  # not match(): "$" also matches before a final "\n"
        raise CniError(
            INVALID_ENV,
            "CNI_CONTAINERID has invalid characters: it must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$",
            value,
        )


def validate_network_name(value: str) -> None:
    """The spec's rule for a network name (libcni/skel ValidateNetworkName): plugins use it in paths."""
    if not value:
        raise CniError(INVALID_CONFIG, "config field 'name' is missing: name the network")
    if not NETWORK_NAME_RE.fullmatch(value):
        raise CniError(
            INVALID_CONFIG,
            "config field 'name' has invalid characters: it must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$",
            value,
        )


def validate_ifname(value: str) -> None:
    problem = ""
    if not value:
        problem = "is empty"
    elif len(value.encode()) > IFNAME_MAX:
        # IFNAMSIZ counts bytes, not characters (Go's len() in libcni does the same).
        problem = f"is {len(value.encode())} bytes long; the kernel allows at most {IFNAME_MAX}"
    elif value in (".", ".."):
        problem = "may not be '.' or '..'"
    elif any(c in value for c in "/:") or any(c.isspace() for c in value):
        problem = "may not contain '/', ':' or whitespace"
    if problem:
        raise CniError(INVALID_ENV, f"CNI_IFNAME {problem}", value)


def parse_cni_args(raw: str, known: frozenset[str]) -> dict[str, str]:
    """``K=V;K=V`` -> dict; unknown keys fail unless ``IgnoreUnknown`` is true."""
    args: dict[str, str] = {}
    for pair in filter(None, raw.split(";")):
        key, sep, value = pair.partition("=")
        if not sep or not key or "=" in value:
            raise CniError(INVALID_ENV, f"CNI_ARGS: invalid pair {pair!r}: each entry must be KEY=VALUE")
        args[key] = value
    ignore = args.get("IgnoreUnknown", "false").lower()
    if ignore not in ("1", "true", "0", "false"):
        raise CniError(INVALID_ENV, f"CNI_ARGS: IgnoreUnknown={args['IgnoreUnknown']!r} is not a boolean")
    unknown = sorted(k for k in args if k not in STANDARD_ARGS and k not in known)
    if unknown and ignore in ("0", "false"):
        raise CniError(
            INVALID_ENV,
            f"CNI_ARGS: unknown keys {unknown}: add IgnoreUnknown=1 or remove them",
        )
    return args


def decode_config(stdin: bytes) -> dict[str, Any]:
    if len(stdin) > MAX_STDIN:
        raise CniError(
            DECODE_FAILURE, f"network config on stdin is {len(stdin)} bytes; the limit is {MAX_STDIN}"
        )
    if not stdin.strip():
        # skel answers an empty stdin with a decode failure too: there is no config to act on.
        raise CniError(DECODE_FAILURE, "no network config on stdin: the runtime must pass the JSON config")
    try:
        data = json.loads(stdin)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CniError(DECODE_FAILURE, f"network config on stdin is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CniError(DECODE_FAILURE, "network config on stdin must be a JSON object")
    return data


def config_version(config: Mapping[str, Any]) -> str:
    value = config.get("cniVersion")
    if value is None:
        raise CniError(INVALID_CONFIG, "config field 'cniVersion' is missing: set it, e.g. \"1.0.0\"")
    if not isinstance(value, str):
        raise CniError(INVALID_CONFIG, "config field 'cniVersion' must be a string such as \"1.0.0\"")
    if not cniver.is_supported(value):
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"incompatible CNI versions: config cniVersion {value!r} is not one of {list(cniver.SUPPORTED)}",
        )
    return value


def _string_field(config: Mapping[str, Any], key: str, required: bool) -> str:
    value = config.get(key)
    if value is None:
        if required:
            raise CniError(INVALID_CONFIG, f"config field '{key}' is missing")
        return ""
    if not isinstance(value, str):
        raise CniError(INVALID_CONFIG, f"config field '{key}' must be a string")
    return value


def _attachments(config: Mapping[str, Any]) -> tuple[Attachment, ...] | None:
    for key in ("cni.dev/valid-attachments", "cni.dev/attachments"):
        if key not in config:
            continue
        raw = config[key]
        if not isinstance(raw, list):
            raise CniError(INVALID_CONFIG, f"config field '{key}' must be a list of {{containerID, ifname}}")
        out = []
        for entry in raw:
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("containerID"), str)
                or not isinstance(entry.get("ifname"), str)
            ):
                raise CniError(
                    INVALID_CONFIG,
                    f"config field '{key}': every entry needs string 'containerID' and 'ifname'",
                )
            out.append(Attachment(entry["containerID"], entry["ifname"]))
        return tuple(out)
    return None


def parse_request(
    env: Mapping[str, str], stdin: bytes, command: str, known_args: frozenset[str] = frozenset()
) -> Request:
    """Validate env and config for ``command`` (already known to be a verb other than VERSION)."""
    missing = [k for k in REQUIRED_ENV[command] if not env.get(k)]
    if missing:
        raise CniError(INVALID_ENV, f"required env variables {missing} missing for {command}")
    container_id = env.get("CNI_CONTAINERID", "")
    if container_id or command in ("ADD", "DEL", "CHECK"):
        validate_container_id(container_id)
    ifname = env.get("CNI_IFNAME", "")
    if ifname or command in ("ADD", "DEL", "CHECK"):
        validate_ifname(ifname)
    netns = env.get("CNI_NETNS", "")
    if netns and command in ("ADD", "CHECK") and not netns.startswith("/"):
        raise CniError(
            INVALID_ENV, f"CNI_NETNS must be an absolute path to a network namespace, got {netns!r}"
        )
    args = parse_cni_args(env.get("CNI_ARGS", ""), known_args)
    config = decode_config(stdin)
    cni_version = config_version(config)
    minimum = MIN_VERSION.get(command)
    if minimum and not cniver.at_least(cni_version, minimum):
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"config version does not allow {command}: cniVersion {cni_version} < {minimum}",
        )
    runtime_config = config.get("runtimeConfig")
    if runtime_config is None:
        runtime_config = {}
    elif not isinstance(runtime_config, dict):
        raise CniError(INVALID_CONFIG, "config field 'runtimeConfig' must be a JSON object")
    _string_field(config, "type", required=False)
    name = _string_field(config, "name", required=True)
    validate_network_name(name)
    prev = config.get("prevResult")
    return Request(
        command=command,
        cni_version=cni_version,
        container_id=container_id,
        netns=netns,
        ifname=ifname,
        args=args,
        path=tuple(p for p in env.get("CNI_PATH", "").split(":") if p),
        name=name,
        config=config,
        runtime_config=runtime_config,
        prev_result=None if prev is None else parse_result(prev),
        valid_attachments=_attachments(config) if command == "GC" else None,
        env=dict(env),
        stdin=stdin,
    )
