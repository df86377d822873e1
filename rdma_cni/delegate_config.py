"""What every RDMA delegate config (rdma-macvlan's, rdma-ipvlan's) says alike, read by the plugins
and by every other component of the node that must agree with them on it: the device plugin, the
doctor and the agent.

- Where their files are and how they log (:class:`FilesConfig`, :func:`files_fields`): one class
  and one table, so both plugins read them alike; only the records directory's default differs.
- The facts STATUS and the other components read (:func:`parse_status_config`): which bonds
  (``masters``), where the records are (``dataDir``), sysfs, IPAM, logging and the RDMA netns mode,
  checked as the plugins' full models check them but without loading them (STATUS may be asked
  every few seconds).
- Which bonds a config means (:func:`bonds`): the ones it names, else every netdev that backs a RoCE
  port (:func:`rdma_cni.rdma.sysfs.default_masters`).

    status = parse_status_config(json.load(f), data_dir="/var/lib/cni/rdma-macvlan")
    bonds(status.masters, status.sysfs_root)   # ["bond0", "bond1", ...]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rdma_cni.cni import config_fields as cf
from rdma_cni.cni.errors import INVALID_CONFIG, CniError, ConfigKeyError, invalid_key
from rdma_cni.node_policy import NodePolicy
from rdma_cni.rdma import sysfs

# The device plugin's resource of exclusive mode, which a delegate that picks bonds itself must
# respect (a config's "resourceName" key; a NAD's k8s.v1.cni.cncf.io/resourceName under Multus).
RDMA_RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
DEFAULT_RUN_DIR = "/run/rdma-cni"  # both plugins': the GID records of both modes in one place
LOG_LEVELS = ("debug", "info", "warning", "error")
NETNS_MODES = ("shared", "exclusive")

# What to tell the user for each shared key, shown with the validation problem (each plugin's own
# table adds its own keys to these).
FIXES = {
    "masters": 'a list of bond netdev names, e.g. "masters": ["bond0", "bond1"]',
    "ipam": "an IPAM plugin config object with a \"type\", or leave it out to move the bond's IPs",
    "rdma": 'an object, e.g. {"required": true, "netnsMode": "shared"}',
    "rdma.netnsMode": '"shared" or "exclusive"',
    "dataDir": "an absolute directory path",
    "runDir": "an absolute directory path",
    "sysfsRoot": "an absolute directory path, normally /sys",
    "logFile": "a file path, or \"\" for stderr only",
    "logLevel": 'one of "debug", "info", "warning", "error"',
}


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


def check_ipam(ipam: object) -> None:
    """What a model's ``dict`` type cannot say: an IPAM config names its plugin."""
    if ipam is not None and not (isinstance(ipam, dict) and isinstance(ipam.get("type"), str)):
        msg = f"config key 'ipam.type' is missing or not a string: {FIXES['ipam']}"
        raise ConfigKeyError("ipam.type", msg)


def check_masters(masters: object) -> None:
    """A non-empty list of netdev names (no empty name, no path)."""
    if masters is not None and (
        not isinstance(masters, list)
        or not masters
        or any(not isinstance(m, str) or not m or "/" in m for m in masters)
    ):
        raise ConfigKeyError("masters", f"config key 'masters' is invalid: {FIXES['masters']}")


def bonds(masters: list[str] | None, sysfs_root: str, ports: list[sysfs.RdmaPort] | None = None) -> list[str]:
    """The bonds a config means: ``masters`` (each once, in order), else every netdev that backs a
    RoCE port; none at all is error 7, since no ADD could succeed."""
    if masters:
        return list(dict.fromkeys(masters))
    found = sysfs.default_masters(sysfs_root, ports)
    if found:
        return found
    raise CniError(
        INVALID_CONFIG,
        "config key 'masters' is missing and no RDMA device backs a netdev on this node: "
        'list the bonds, e.g. "masters": ["bond0"]',
    )


def bounded_masters(policy: NodePolicy, masters: list[str] | None, sysfs_root: str) -> list[str] | None:
    """A config's ``masters`` within the node's bonds (the policy's ``bonds``, else the netdevs that
    back the node's RDMA devices): a name outside them is error 7; no ``masters`` means the policy's
    bonds when it lists them. Unchanged where the policy lets configs decide."""
    if not policy.enforced:
        return masters
    policy.check_masters(masters, policy.node_bonds(sysfs.default_masters(sysfs_root) if policy.bonds is None
                                                   else ()))
    if masters is None and policy.bonds is not None:
        return list(policy.bonds)
    return masters


# --- STATUS: the keys it reads, and only those --------------------------------------------------


@dataclass(frozen=True)
class StatusRdma:
    """``rdma.netnsMode``: the one key of ``rdma`` STATUS reads."""

    netns_mode: str = "shared"


@dataclass(frozen=True)
class StatusConfig:
    """What STATUS reads of the config, named like the models' fields, checked as the models check
    them (same types, same messages; a test keeps the two in step). A key STATUS does not read
    (``count``, ``mode``, ``mtu`` ...) is left to ADD's full validation: a node whose masters and
    state are fine is ready, and the ADD that a bad ``count`` would break says so for its pod."""

    masters: list[str] | None
    data_dir: str
    sysfs_root: str
    ipam: dict[str, Any] | None
    log_file: str
    log_level: str
    rdma: StatusRdma


def parse_status_config(raw: dict[str, Any], data_dir: str) -> StatusConfig:
    """The status facts of a delegate config, ``data_dir`` being its plugin's records directory."""
    rdma = raw.get("rdma", {})
    if not isinstance(rdma, dict):
        raise _bad("rdma", "Input should be a valid dictionary", rdma)
    mode = rdma.get("netnsMode", "shared")
    if mode not in NETNS_MODES or not isinstance(mode, str):
        raise _bad("rdma.netnsMode", "Input should be 'shared' or 'exclusive'", mode)
    masters = raw.get("masters")
    check_masters(masters)
    ipam = raw.get("ipam")
    check_ipam(ipam)
    level = raw.get("logLevel", "info")
    if level not in LOG_LEVELS or not isinstance(level, str):
        raise _bad("logLevel", "Input should be 'debug', 'info', 'warning' or 'error'", level)
    return StatusConfig(
        masters=list(masters) if masters is not None else None,
        data_dir=_path(raw, "dataDir", data_dir),
        sysfs_root=_path(raw, "sysfsRoot", "/sys"),
        ipam=ipam,
        log_file=_text(raw, "logFile", FilesConfig.log_file),
        log_level=level,
        rdma=StatusRdma(netns_mode=mode),
    )


def _path(raw: dict[str, Any], key: str, default: str) -> str:
    value = _text(raw, key, default)
    if not value:
        raise _bad(key, "String should have at least 1 character", value)
    return value


def _text(raw: dict[str, Any], key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise _bad(key, "Input should be a valid string", value)
    return value


def _bad(key: str, problem: str, got: Any) -> ConfigKeyError:
    # Every key read here has a fix, so the plugin's name (only used without one) is never shown.
    return invalid_key(key, problem, got, FIXES, "rdma-macvlan")
