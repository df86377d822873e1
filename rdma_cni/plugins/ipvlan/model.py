"""The rdma-ipvlan network config model; :func:`.config.parse_config` reads and validates it.

Each class is a frozen dataclass (attribute names are the config keys in snake_case) and the table
beside it says how each key is checked (:mod:`rdma_cni.cni.config_fields`, strict JSON types).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rdma_cni.cni import config_fields as cf
from rdma_cni.delegate_config import FilesConfig, files_fields

DEFAULT_DATA_DIR = "/var/lib/cni/rdma-ipvlan"


@dataclass(frozen=True)
class RdmaConfig:
    """The config's ``rdma`` object."""

    required: bool = True
    gid_timeout_ms: int = 2000


RDMA_FIELDS = (
    cf.field("required", cf.boolean, True),
    cf.field("gid_timeout_ms", cf.integer(ge=0, le=600_000), 2000, key="gidTimeoutMs"),
)


@dataclass(frozen=True)
class IpvlanConfig(FilesConfig):
    """rdma-ipvlan's network config, checked."""

    data_dir: str = DEFAULT_DATA_DIR
    name: str = ""
    masters: list[str] | None = None
    link: Literal["ipvlan", "macvlan"] = "ipvlan"
    ipvlan_mode: Literal["l2", "l3", "l3s"] = "l2"
    ranges: dict[str, str | list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=list)
    mtu: int | None = None
    rdma: RdmaConfig = field(default_factory=RdmaConfig)


_TEXTS = cf.either(
    cf.string(), cf.list_of(cf.string()), "Input should be a valid string or a list of strings"
)

FIELDS = (
    cf.field("name", cf.string(), ""),
    cf.field("masters", cf.optional(cf.list_of(cf.string())), None),
    cf.field("link", cf.one_of("ipvlan", "macvlan"), "ipvlan"),
    cf.field("ipvlan_mode", cf.one_of("l2", "l3", "l3s"), "l2", key="ipvlanMode"),
    cf.Field("ranges", "ranges", cf.dict_of(_TEXTS), dict),
    cf.Field("exclude", "exclude", cf.list_of(cf.string()), list),
    cf.field("mtu", cf.optional(cf.integer(ge=68, le=65535)), None),
    cf.Field("rdma", "rdma", cf.nested(RdmaConfig, RDMA_FIELDS), RdmaConfig),
    *files_fields(DEFAULT_DATA_DIR),
)


def read(raw: dict[str, Any]) -> IpvlanConfig:
    return cf.read(IpvlanConfig, FIELDS, raw)
