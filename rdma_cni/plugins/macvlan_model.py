"""The rdma-macvlan network config model (pydantic); :func:`macvlan_config.parse_config` validates.

Its own module so that only the verbs that need the whole config import pydantic (~90 ms of a cold
start): STATUS reads the few keys it needs through ``macvlan_config.parse_status_config``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_MODEL = ConfigDict(extra="ignore", strict=True, populate_by_name=True, frozen=True)


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
