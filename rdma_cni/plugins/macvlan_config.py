"""The rdma-macvlan network config (DESIGN.md "rdma-macvlan: behaviour"), validated strictly.

Keys are camelCase like every CNI config; unknown keys are ignored (a conflist may carry keys for
other plugins); a wrong type or value is CNI error 7 naming the key and how to fix it, raised before
anything on the node is touched. Types are strict (``"1"`` is not a number, ``1`` is not a boolean).

Plain dataclasses and a few checks, not pydantic: importing pydantic and building the model cost
~130 ms of CPU on every cold plugin start, for thirteen keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.cni.errors import INVALID_CONFIG, CniError

# What to tell the user for each key, shown with the validation problem.
FIXES = {
    "masters": 'a list of bond netdev names, e.g. "masters": ["bond0", "bond1"]',
    "count": 'a whole number of bonds per pod, 1-64, e.g. "count": 1',
    "mode": 'one of "bridge", "private", "vepa", "passthru"',
    "mtu": 'a whole number 68-65535 not above the bond\'s MTU, or leave it out',
    "podIfName": '"master" (pod interface named like the bond) or "cni" (CNI_IFNAME)',
    "ipam": "an IPAM plugin config object with a \"type\", or leave it out to move the bond's IPs",
    "rdma": 'an object, e.g. {"required": true, "netnsMode": "shared"}',
    "rdma.netnsMode": '"shared" or "exclusive"',
    "rdma.required": "true or false (JSON booleans, not strings)",
    "rdma.gidIndex": '"host" or a GID table index such as 3',
    "rdma.gidTimeoutMs": "milliseconds as a whole number, e.g. 2000",
    "dataDir": "an absolute directory path",
    "runDir": "an absolute directory path",
    "sysfsRoot": "an absolute directory path, normally /sys",
    "logFile": "a file path, or \"\" for stderr only",
    "logLevel": 'one of "debug", "info", "warning", "error"',
}


MODES = ("bridge", "private", "vepa", "passthru")
NETNS_MODES = ("shared", "exclusive")
POD_IF_NAMES = ("master", "cni")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class RdmaConfig:
    netns_mode: str = "shared"
    required: bool = True
    gid_index: str | int = "host"
    gid_timeout_ms: int = 2000


@dataclass(frozen=True)
class MacvlanConfig:
    name: str = ""
    masters: list[str] | None = None
    count: int = 1
    mode: str = "bridge"
    mtu: int | None = None
    pod_if_name: str = "master"
    ipam: dict[str, Any] | None = None
    rdma: RdmaConfig = field(default_factory=RdmaConfig)
    data_dir: str = "/var/lib/cni/rdma-macvlan"
    run_dir: str = "/run/rdma-cni"
    sysfs_root: str = "/sys"
    log_file: str = "/var/log/rdma-cni/rdma-cni.log"
    log_level: str = "info"


class _Invalid(Exception):
    """One key's problem: (dotted key, what is wrong, the value given)."""

    def __init__(self, key: str, problem: str, got: Any) -> None:
        super().__init__(key, problem, got)
        self.key, self.problem, self.got = key, problem, got


Check = Callable[[str, Any], Any]


def _int(lo: int, hi: int) -> Check:
    def check(key: str, v: Any) -> Any:
        if not isinstance(v, int) or isinstance(v, bool):
            raise _Invalid(key, "Input should be a valid integer", v)
        if not lo <= v <= hi:
            raise _Invalid(key, f"Input should be between {lo} and {hi}", v)
        return v
    return check


def _one_of(*choices: str) -> Check:
    def check(key: str, v: Any) -> Any:
        if v not in choices or not isinstance(v, str):
            raise _Invalid(key, "Input should be " + " or ".join(repr(c) for c in choices), v)
        return v
    return check


def _str(min_length: int = 0) -> Check:
    def check(key: str, v: Any) -> Any:
        if not isinstance(v, str):
            raise _Invalid(key, "Input should be a valid string", v)
        if len(v) < min_length:
            raise _Invalid(key, f"String should have at least {min_length} character", v)
        return v
    return check


def _bool(key: str, v: Any) -> Any:
    if not isinstance(v, bool):
        raise _Invalid(key, "Input should be a valid boolean", v)
    return v


def _optional(check: Check) -> Check:
    return lambda key, v: None if v is None else check(key, v)


def _str_list(key: str, v: Any) -> Any:
    if not isinstance(v, list):
        raise _Invalid(key, "Input should be a valid list", v)
    for item in v:
        _str()(key, item)
    return list(v)


def _object(key: str, v: Any) -> Any:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise _Invalid(key, "Input should be a valid dictionary", v)
    return v


def _gid_index(key: str, v: Any) -> Any:
    if v == "host" and isinstance(v, str):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise _Invalid(key, "Input should be 'host' or a valid integer", v)


# alias -> (field name, check); the alias is the documented key, the field name is accepted too.
_RDMA_KEYS: dict[str, tuple[str, Check]] = {
    "netnsMode": ("netns_mode", _one_of(*NETNS_MODES)),
    "required": ("required", _bool),
    "gidIndex": ("gid_index", _gid_index),
    "gidTimeoutMs": ("gid_timeout_ms", _int(0, 600_000)),
}
_KEYS: dict[str, tuple[str, Check]] = {
    "name": ("name", _str()),
    "masters": ("masters", _optional(_str_list)),
    "count": ("count", _int(1, 64)),
    "mode": ("mode", _one_of(*MODES)),
    "mtu": ("mtu", _optional(_int(68, 65535))),
    "podIfName": ("pod_if_name", _one_of(*POD_IF_NAMES)),
    "ipam": ("ipam", _optional(_object)),
    "rdma": ("rdma", lambda key, v: _rdma(_object(key, v))),
    "dataDir": ("data_dir", _str(1)),
    "runDir": ("run_dir", _str(1)),
    "sysfsRoot": ("sysfs_root", _str(1)),
    "logFile": ("log_file", _str()),
    "logLevel": ("log_level", _one_of(*LOG_LEVELS)),
}


def _fields(raw: Mapping[str, Any], keys: dict[str, tuple[str, Check]], prefix: str) -> dict[str, Any]:
    out = {}
    for alias, (name, check) in keys.items():
        for given in (alias, name):
            if given in raw:
                out[name] = check(prefix + alias, raw[given])
                break
    return out


def _rdma(raw: Mapping[str, Any]) -> RdmaConfig:
    return RdmaConfig(**_fields(raw, _RDMA_KEYS, "rdma."))


def parse_config(raw: dict[str, Any]) -> MacvlanConfig:
    """Validate the network config; the first problem becomes CNI error 7 naming key and fix."""
    if not isinstance(raw, dict):
        raise CniError(INVALID_CONFIG, "the network config is not a JSON object")
    try:
        cfg = MacvlanConfig(**_fields(raw, _KEYS, ""))
    except _Invalid as exc:
        raise _config_error(exc) from None
    if cfg.ipam is not None and not isinstance(cfg.ipam.get("type"), str):
        raise CniError(INVALID_CONFIG, f"config key 'ipam.type' is missing or not a string: {FIXES['ipam']}")
    if cfg.masters is not None and (not cfg.masters or any(not m or "/" in m for m in cfg.masters)):
        raise CniError(INVALID_CONFIG, f"config key 'masters' is invalid: {FIXES['masters']}")
    if isinstance(cfg.rdma.gid_index, int) and not 0 <= cfg.rdma.gid_index < 65536:
        fix = FIXES["rdma.gidIndex"]
        raise CniError(INVALID_CONFIG, f"config key 'rdma.gidIndex' is out of range: {fix}")
    return cfg


def _config_error(exc: _Invalid) -> CniError:
    top = exc.key.split(".")[0]
    fix = FIXES.get(exc.key) or FIXES.get(top) or "see the rdma-macvlan config reference"
    shown = repr(exc.got) if not isinstance(exc.got, dict) else "an object"
    msg = f"config key '{exc.key}' is invalid ({exc.problem}, got {shown}): use {fix}"
    return CniError(INVALID_CONFIG, msg)
