"""The rdma-ipvlan network config model (pydantic); :func:`.config.parse_config` validates it.

Its own module so that a VERSION or a malformed request never imports pydantic (~90 ms cold).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_MODEL = ConfigDict(extra="ignore", strict=True, populate_by_name=True, frozen=True)

DEFAULT_DATA_DIR = "/var/lib/cni/rdma-ipvlan"
DEFAULT_RUN_DIR = "/run/rdma-cni"  # rdma-macvlan's: the GID records of both modes in one place


class RdmaConfig(BaseModel):
    model_config = _MODEL

    required: bool = True
    gid_timeout_ms: int = Field(2000, alias="gidTimeoutMs", ge=0, le=600_000)


class IpvlanConfig(BaseModel):
    model_config = _MODEL

    name: str = ""
    masters: list[str] | None = None
    link: Literal["ipvlan", "macvlan"] = "ipvlan"
    ipvlan_mode: Literal["l2", "l3", "l3s"] = Field("l2", alias="ipvlanMode")
    ranges: dict[str, str | list[str]] = Field(default_factory=dict)
    exclude: list[str] = Field(default_factory=list)
    mtu: int | None = Field(None, ge=68, le=65535)
    rdma: RdmaConfig = Field(default_factory=lambda: RdmaConfig.model_validate({}))
    data_dir: str = Field(DEFAULT_DATA_DIR, alias="dataDir", min_length=1)
    run_dir: str = Field(DEFAULT_RUN_DIR, alias="runDir", min_length=1)
    sysfs_root: str = Field("/sys", alias="sysfsRoot", min_length=1)
    log_file: str = Field("/var/log/rdma-cni/rdma-cni.log", alias="logFile")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", alias="logLevel")
