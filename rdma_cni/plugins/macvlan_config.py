"""The rdma-macvlan network config (DESIGN.md "rdma-macvlan: behaviour"), validated by pydantic.

Keys are camelCase like every CNI config; unknown keys are ignored (a conflist may carry keys for
other plugins); a wrong type or value is CNI error 7 naming the key and how to fix it, raised before
anything on the node is touched.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rdma_cni.cni.errors import INVALID_CONFIG, CniError

_MODEL = ConfigDict(extra="ignore", strict=True, populate_by_name=True, frozen=True)

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


class RdmaConfig(BaseModel):
    model_config = _MODEL

    netns_mode: Literal["shared", "exclusive"] = Field("shared", alias="netnsMode")
    required: bool = True
    gid_index: Literal["host"] | int = Field("host", alias="gidIndex")
    gid_timeout_ms: int = Field(2000, alias="gidTimeoutMs", ge=0, le=600_000)


class MacvlanConfig(BaseModel):
    model_config = _MODEL

    name: str = ""
    masters: list[str] | None = None
    count: int = Field(1, ge=1, le=64)
    mode: Literal["bridge", "private", "vepa", "passthru"] = "bridge"
    mtu: int | None = Field(None, ge=68, le=65535)
    pod_if_name: Literal["master", "cni"] = Field("master", alias="podIfName")
    ipam: dict[str, Any] | None = None
    rdma: RdmaConfig = Field(default_factory=lambda: RdmaConfig.model_validate({}))
    data_dir: str = Field("/var/lib/cni/rdma-macvlan", alias="dataDir", min_length=1)
    run_dir: str = Field("/run/rdma-cni", alias="runDir", min_length=1)
    sysfs_root: str = Field("/sys", alias="sysfsRoot", min_length=1)
    log_file: str = Field("/var/log/rdma-cni/rdma-cni.log", alias="logFile")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", alias="logLevel")


def parse_config(raw: dict[str, Any]) -> MacvlanConfig:
    """Validate the network config; the first problem becomes CNI error 7 naming key and fix."""
    try:
        cfg = MacvlanConfig.model_validate(raw)
    except ValidationError as exc:
        raise _config_error(exc) from None
    if cfg.ipam is not None and not isinstance(cfg.ipam.get("type"), str):
        raise CniError(INVALID_CONFIG, f"config key 'ipam.type' is missing or not a string: {FIXES['ipam']}")
    if cfg.masters is not None and (not cfg.masters or any(not m or "/" in m for m in cfg.masters)):
        raise CniError(INVALID_CONFIG, f"config key 'masters' is invalid: {FIXES['masters']}")
    if isinstance(cfg.rdma.gid_index, int) and not 0 <= cfg.rdma.gid_index < 65536:
        fix = FIXES["rdma.gidIndex"]
        raise CniError(INVALID_CONFIG, f"config key 'rdma.gidIndex' is out of range: {fix}")
    return cfg


_TYPE_TAGS = {"int", "str", "bool", "list", "dict", "float", "none"}


def _config_error(exc: ValidationError) -> CniError:
    err = exc.errors()[0]
    # loc holds field aliases, list positions and (for unions) member tags like "literal['host']".
    parts = [str(p) for p in err["loc"] if isinstance(p, str) and "[" not in p and p not in _TYPE_TAGS]
    key = ".".join(parts)
    top = key.split(".")[0]
    fix = FIXES.get(key) or FIXES.get(top) or "see the rdma-macvlan config reference"
    got = err.get("input")
    shown = repr(got) if not isinstance(got, dict) else "an object"
    return CniError(INVALID_CONFIG, f"config key '{key}' is invalid ({err['msg']}, got {shown}): use {fix}")
