"""The pool lists a config file may hold, read into :class:`~rdma_cni.devices.pools.PoolSpec`.

Two forms (the third, ``mode: shared``, is one key of :mod:`~rdma_cni.devices.config`):

``pools:`` in our own config::

    pools:
      - {resourceName: tke.cloud.tencent.com/tke-shared-rdma, mode: exclusive}
      - {resourceName: rdma/ib, mode: shared, count: 100, selectors: {linkTypes: [infiniband]}}

Mellanox's k8s-rdma-shared-dev-plugin ``config.json``, unchanged (recognised by ``configList``)::

    {"periodicUpdateInterval": 300,
     "configList": [{"resourceName": "hca_shared_devices_a", "resourcePrefix": "rdma",
                     "rdmaHcaMax": 200, "selectors": {"ifNames": ["ibs108"]}}]}

each entry a shared pool ``<resourcePrefix, default rdma>/<resourceName>`` of ``rdmaHcaMax``
devices. ``periodicUpdateInterval`` is accepted and not needed (the plugin rescans every
``rescanIntervalSeconds`` and on every netlink event). Every key this plugin does not implement is
an error naming it, never silently ignored. Errors are :class:`ConfigError` (key, value, fix).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from rdma_cni.devices.errors import ConfigError
from rdma_cni.devices.pools import DEFAULT_SHARED_COUNT, EXCLUSIVE, MODES, SHARED, PoolSpec
from rdma_cni.devices.selectors import Selectors, parse_if_names, parse_selectors

MAX_COUNT = 100_000  # a ListAndWatch message lists every device: 100k stay well inside gRPC's 4 MiB
MELLANOX_KEYS = ("configList", "periodicUpdateInterval")
MELLANOX_ENTRY_KEYS = ("resourceName", "resourcePrefix", "rdmaHcaMax", "selectors", "devices")
POOL_KEYS = ("resourceName", "mode", "count", "selectors")
_MELLANOX_NAME = re.compile(r"[a-zA-Z0-9_]+")


def count(value: object, key: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_COUNT:
        raise ConfigError(
            key,
            value,
            f"use a whole number from {minimum} to {MAX_COUNT}: how many pods may "
            f"share the pool at once (TKE uses {DEFAULT_SHARED_COUNT})",
            where,
        )
    return value


def _entry(value: object, key: str, where: str, known: tuple[str, ...]) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ConfigError(
            key,
            value,
            "each entry must be a mapping, for example "
            '{"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 100}',
            where,
        )
    for name in value:
        if name not in known:
            raise ConfigError(
                f"{key}.{name}",
                value[name],
                f"this plugin does not implement it; an entry takes only {', '.join(known)}",
                where,
            )
    return value


def parse_pools(value: object, where: str, resource_name: Callable[[object], str]) -> tuple[PoolSpec, ...]:
    """``pools:`` (``resource_name`` checks an extended resource name, raising ValueError)."""
    if not isinstance(value, list) or not value:
        raise ConfigError(
            "pools", value, "use a non-empty list of {resourceName, mode, count, selectors}", where
        )
    out = []
    for i, item in enumerate(value):
        key = f"pools[{i}]"
        entry = _entry(item, key, where, POOL_KEYS)
        name = _name(entry.get("resourceName"), f"{key}.resourceName", where, resource_name)
        mode = entry.get("mode", EXCLUSIVE)
        if mode not in MODES:
            raise ConfigError(
                f"{key}.mode",
                mode,
                "use exclusive (one device per RDMA bond) or shared "
                "(count virtual devices, every pod gets every HCA of the pool)",
                where,
            )
        if mode == EXCLUSIVE and "count" in entry:
            raise ConfigError(
                f"{key}.count",
                entry["count"],
                "an exclusive pool counts its bonds: leave count out, or use mode: shared",
                where,
            )
        n = count(entry.get("count", DEFAULT_SHARED_COUNT), f"{key}.count", where) if mode == SHARED else 0
        sel = parse_selectors(entry["selectors"], f"{key}.selectors", where) if "selectors" in entry else None
        out.append(PoolSpec(name, str(mode), n, sel, key))
    return _unique(out, where)


def _name(value: object, key: str, where: str, resource_name: Callable[[object], str]) -> str:
    try:
        return resource_name(value)
    except ValueError:
        raise ConfigError(
            key,
            value,
            "use an extended resource name 'domain/name' outside kubernetes.io, "
            "for example rdma/hca_shared_devices_a",
            where,
        ) from None


def _unique(specs: list[PoolSpec], where: str) -> tuple[PoolSpec, ...]:
    seen: dict[str, PoolSpec] = {}
    for spec in specs:
        if spec.resource_name in seen:
            raise ConfigError(
                f"{spec.origin}.resourceName",
                spec.resource_name,
                f"{seen[spec.resource_name].origin} has the same resource: give each pool a name of its own",
                where,
            )
        seen[spec.resource_name] = spec
    return tuple(specs)


def parse_mellanox(
    data: Mapping[str, object], where: str, resource_name: Callable[[object], str]
) -> tuple[PoolSpec, ...]:
    """Mellanox's ``config.json`` (see the module doc)."""
    for name in data:
        if name not in MELLANOX_KEYS:
            raise ConfigError(
                str(name),
                data[name],
                "a k8s-rdma-shared-dev-plugin config.json takes only "
                f"{', '.join(MELLANOX_KEYS)} (our own keys go in a config without configList)",
                where,
            )
    interval = data.get("periodicUpdateInterval", 60)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
        raise ConfigError(
            "periodicUpdateInterval",
            interval,
            "use a whole number of seconds >= 0 (it is accepted "
            "as Mellanox's; this plugin rescans on its own, faster)",
            where,
        )
    entries = data["configList"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            "configList",
            entries,
            'use a non-empty list of pools, each {"resourceName", "rdmaHcaMax", "selectors"}',
            where,
        )
    return _unique([_mellanox_entry(item, i, where, resource_name) for i, item in enumerate(entries)], where)


def _mellanox_entry(item: object, i: int, where: str, resource_name: Callable[[object], str]) -> PoolSpec:
    key = f"configList[{i}]"
    entry = _entry(item, key, where, MELLANOX_ENTRY_KEYS)
    short = entry.get("resourceName")
    if not isinstance(short, str) or not _MELLANOX_NAME.fullmatch(short):
        raise ConfigError(
            f"{key}.resourceName",
            short,
            "use letters, digits and _ only, for example "
            "hca_shared_devices_a (the resource becomes <resourcePrefix>/<resourceName>)",
            where,
        )
    prefix = entry.get("resourcePrefix", "rdma")
    name = _name(
        f"{prefix}/{short}" if isinstance(prefix, str) else prefix,
        f"{key}.resourcePrefix",
        where,
        resource_name,
    )
    if "rdmaHcaMax" not in entry:
        raise ConfigError(
            f"{key}.rdmaHcaMax", None, "give how many pods may share the pool, for example 200", where
        )
    n = count(entry["rdmaHcaMax"], f"{key}.rdmaHcaMax", where, minimum=0)
    if "selectors" in entry and "devices" in entry:
        raise ConfigError(
            f"{key}.devices",
            entry["devices"],
            "give selectors or the deprecated devices, not both "
            "(devices is selectors.ifNames: move it there)",
            where,
        )
    if "devices" in entry:
        sel = parse_if_names(entry["devices"], f"{key}.devices", where)
    elif "selectors" in entry:
        sel = parse_selectors(entry["selectors"], f"{key}.selectors", where)
    else:
        sel = Selectors()  # Mellanox's own default: every HCA
    return PoolSpec(name, SHARED, n, sel, key)
