"""The config keys both RDMA plugins share: where their files are (records, GID records, sysfs) and
where and how much they log. One class and one table, so rdma-macvlan and rdma-ipvlan read them alike;
only the records directory's default differs (each plugin its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rdma_cni.cni import config_fields as cf

DEFAULT_RUN_DIR = "/run/rdma-cni"  # both plugins': the GID records of both modes in one place


@dataclass(frozen=True)
class FilesConfig:
    """The base of each plugin's config class (its own keys follow these)."""

    data_dir: str = ""  # each plugin's class gives its own records directory as the default
    run_dir: str = DEFAULT_RUN_DIR
    sysfs_root: str = "/sys"
    log_file: str = "/var/log/rdma-cni/rdma-cni.log"
    log_level: Literal["debug", "info", "warning", "error"] = "info"


def files_fields(data_dir: str) -> tuple[cf.Field, ...]:
    """The shared keys' table, with the plugin's own records directory as ``dataDir``'s default."""
    return (
        cf.field("data_dir", cf.string(min_length=1), data_dir, key="dataDir"),
        cf.field("run_dir", cf.string(min_length=1), DEFAULT_RUN_DIR, key="runDir"),
        cf.field("sysfs_root", cf.string(min_length=1), "/sys", key="sysfsRoot"),
        cf.field("log_file", cf.string(), FilesConfig.log_file, key="logFile"),
        cf.field("log_level", cf.one_of("debug", "info", "warning", "error"), "info", key="logLevel"),
    )
