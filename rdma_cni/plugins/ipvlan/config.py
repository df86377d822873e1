"""The rdma-ipvlan network config, read and validated by the model in :mod:`.model`; a wrong type
or value is CNI error 7 naming the key and the fix, raised before anything on the node is touched.
Unknown keys are ignored (a conflist may carry keys for other plugins).

What can only be checked against the node (a range outside its bond's subnet) is checked by ADD,
with the same kind of error (:func:`check_ranges`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rdma_cni.cni.config_fields import Invalid
from rdma_cni.cni.errors import ConfigKeyError, invalid_key, validate_dropping_bad_keys
from rdma_cni.plugins.ipvlan import model
from rdma_cni.plugins.ipvlan.model import IpvlanConfig
from rdma_cni.plugins.ipvlan.pool import Span, Subnet, outside, parse_span

FIXES = {
    "masters": 'a list of bond netdev names, e.g. "masters": ["bond0", "bond1"]',
    "link": '"ipvlan" (one IPVLAN per bond, the bond\'s MAC) or "macvlan" (a MAC per pod, bridge mode)',
    "ipvlanMode": 'one of "l2", "l3", "l3s"',
    "ranges": 'an object of bond -> range(s) inside its subnet, e.g. {"bond0": "198.51.100.4-198.51.100.14"}',
    "exclude": 'a list of addresses or CIDRs never given to a pod, e.g. ["198.51.100.9", "198.51.100.12/30"]',
    "mtu": "a whole number 68-65535 not above the bond's MTU, or leave it out",
    "rdma": 'an object, e.g. {"required": true, "gidTimeoutMs": 2000}',
    "rdma.required": "true or false (JSON booleans, not strings)",
    "rdma.gidTimeoutMs": "milliseconds as a whole number, e.g. 2000",
    "dataDir": "an absolute directory path (default /var/lib/cni/rdma-ipvlan)",
    "runDir": "an absolute directory path (default /run/rdma-cni, shared with rdma-macvlan)",
    "sysfsRoot": "an absolute directory path, normally /sys",
    "logFile": 'a file path, or "" for stderr only',
    "logLevel": 'one of "debug", "info", "warning", "error"',
}


@dataclass(frozen=True)
class Pools:
    """``ranges`` and ``exclude`` parsed: bond -> its spans, and the spans no pod ever gets."""

    ranges: dict[str, list[Span]]
    exclude: list[Span]


def parse_config(raw: dict[str, Any]) -> tuple[IpvlanConfig, Pools]:
    """Validate the network config for ADD/CHECK/STATUS; the first problem is error 7."""
    cfg = _validate(raw)
    return cfg, _pools(cfg)


DEL_ESSENTIAL = frozenset({"dataDir", "data_dir"})  # a key is read by its JSON name or its attribute name


def parse_del_config(raw: dict[str, Any]) -> tuple[IpvlanConfig, list[str]]:
    """The config for DEL/GC, which undo what the records say whatever is wrong with the config
    now: a key that does not validate is left at its default (its problem returned for the log);
    only a bad ``dataDir`` (where the records are) is error 7."""
    return validate_dropping_bad_keys(raw, _validate, DEL_ESSENTIAL)


def _validate(raw: dict[str, Any]) -> IpvlanConfig:
    try:
        cfg = model.read(raw)
    except Invalid as exc:
        raise invalid_key(exc.key, exc.problem, exc.got, FIXES, "rdma-ipvlan") from None
    masters = cfg.masters
    if masters is not None and (not masters or any(not m or "/" in m for m in masters)):
        raise ConfigKeyError("masters", f"config key 'masters' is invalid: {FIXES['masters']}")
    _pools(cfg)
    return cfg


def _pools(cfg: IpvlanConfig) -> Pools:
    ranges: dict[str, list[Span]] = {}
    for bond, value in cfg.ranges.items():
        texts = [value] if isinstance(value, str) else list(value)
        key = f"ranges.{bond}"
        if not texts:
            raise ConfigKeyError("ranges", f"config key '{key}' is an empty list: {FIXES['ranges']}")
        ranges[bond] = [_span(key, t, "ranges") for t in texts]
    exclude = [_span(f"exclude[{i}]", t, "exclude") for i, t in enumerate(cfg.exclude)]
    return Pools(ranges=ranges, exclude=exclude)


def _span(where: str, text: str, key: str) -> Span:
    try:
        return parse_span(text)
    except ValueError as exc:
        raise ConfigKeyError(key, f"config key '{where}' is {text!r} ({exc}): use {FIXES[key]}") from None


def check_ranges(subnet: Subnet, spans: list[Span]) -> None:
    """ADD, once the bond's subnet is known: every range of that family must lie inside it."""
    bad = outside(subnet, spans)
    if bad:
        raise ConfigKeyError(
            "ranges",
            f"config key 'ranges.{subnet.bond}' holds {', '.join(s.describe() for s in bad)}, outside "
            f"{subnet.bond}'s subnet {subnet.network}: give a range inside it, or leave the bond out of "
            "'ranges' to use all of its subnet",
        )
