"""The rdma-macvlan network config (DESIGN.md "rdma-macvlan: behaviour"), read and validated by the
model in :mod:`rdma_cni.plugins.macvlan_model`.

Keys are camelCase like every CNI config; unknown keys are ignored (a conflist may carry keys for
other plugins); a wrong type or value is CNI error 7 naming the key and how to fix it, raised before
anything on the node is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rdma_cni.cni.config_fields import Invalid
from rdma_cni.cni.errors import ConfigKeyError as ConfigKeyError  # moved there: shared by the plugins
from rdma_cni.cni.errors import invalid_key, validate_dropping_bad_keys
from rdma_cni.cni.invoke import is_plain_name
from rdma_cni.plugins import macvlan_model
from rdma_cni.plugins.macvlan_model import MacvlanConfig

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


def parse_config(raw: dict[str, Any]) -> MacvlanConfig:
    """Validate the network config for ADD/CHECK; the first problem is error 7 naming key and fix."""
    cfg = _validate(raw)
    if cfg.ipam is not None and not is_plain_name(cfg.ipam["type"]):
        raise ConfigKeyError(
            "ipam.type",
            f"config key 'ipam.type' is {cfg.ipam['type']!r}: it must be a plain executable name looked up "
            'in CNI_PATH, e.g. "host-local"',
        )
    return cfg


# What DEL cannot do without: where the records are. Every other key has a default that is safe
# for giving the host back, since the record (not the config) says what ADD did.
DEL_ESSENTIAL = frozenset({"dataDir", "data_dir"})  # a key is read by its JSON name or its attribute name


def parse_del_config(raw: dict[str, Any]) -> tuple[MacvlanConfig, list[str]]:
    """The config for DEL/GC, which must undo what ADD did whatever is wrong with the config now
    (edited after ADD, or the config of an ADD that was refused): a key that does not validate is
    left at its default and its problem returned for the log. Only a bad ``dataDir`` is error 7.
    An IPAM ``type`` that can never run is kept here; the IPAM release logs and skips it."""
    return validate_dropping_bad_keys(raw, _validate, DEL_ESSENTIAL)


def _validate(raw: dict[str, Any]) -> MacvlanConfig:
    try:
        cfg = macvlan_model.read(raw)
    except Invalid as exc:
        raise _bad(exc.key, exc.problem, exc.got) from None
    _check_ipam(cfg.ipam)
    _check_masters(cfg.masters)
    if isinstance(cfg.rdma.gid_index, int) and not 0 <= cfg.rdma.gid_index < 65536:
        fix = FIXES["rdma.gidIndex"]
        raise ConfigKeyError("rdma.gidIndex", f"config key 'rdma.gidIndex' is out of range: {fix}")
    return cfg


def _check_ipam(ipam: object) -> None:
    """What the model's ``dict`` type cannot say: an IPAM config names its plugin."""
    if ipam is not None and not (isinstance(ipam, dict) and isinstance(ipam.get("type"), str)):
        msg = f"config key 'ipam.type' is missing or not a string: {FIXES['ipam']}"
        raise ConfigKeyError("ipam.type", msg)


def _check_masters(masters: object) -> None:
    """A non-empty list of netdev names (no empty name, no path)."""
    if masters is not None and (
        not isinstance(masters, list)
        or not masters
        or any(not isinstance(m, str) or not m or "/" in m for m in masters)
    ):
        raise ConfigKeyError("masters", f"config key 'masters' is invalid: {FIXES['masters']}")


# --- STATUS: the keys it reads, and only those --------------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "error")
NETNS_MODES = ("shared", "exclusive")


@dataclass(frozen=True)
class StatusRdma:
    netns_mode: str = "shared"


@dataclass(frozen=True)
class StatusConfig:
    """What STATUS reads of the config, named like the model's fields, checked as the model checks
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


def parse_status_config(raw: dict[str, Any]) -> StatusConfig:
    rdma = raw.get("rdma", {})
    if not isinstance(rdma, dict):
        raise _bad("rdma", "Input should be a valid dictionary", rdma)
    mode = rdma.get("netnsMode", "shared")
    if mode not in NETNS_MODES or not isinstance(mode, str):
        raise _bad("rdma.netnsMode", "Input should be 'shared' or 'exclusive'", mode)
    masters = raw.get("masters")
    _check_masters(masters)
    ipam = raw.get("ipam")
    _check_ipam(ipam)
    level = raw.get("logLevel", "info")
    if level not in LOG_LEVELS or not isinstance(level, str):
        raise _bad("logLevel", "Input should be 'debug', 'info', 'warning' or 'error'", level)
    return StatusConfig(
        masters=list(masters) if masters is not None else None,
        data_dir=_path(raw, "dataDir", "/var/lib/cni/rdma-macvlan"),
        sysfs_root=_path(raw, "sysfsRoot", "/sys"),
        ipam=ipam,
        log_file=_text(raw, "logFile", "/var/log/rdma-cni/rdma-cni.log"),
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
    return invalid_key(key, problem, got, FIXES, "rdma-macvlan")
