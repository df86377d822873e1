"""Which HCAs a pool holds: Mellanox's selectors (k8s-rdma-shared-dev-plugin's ``selectors``).

An HCA matches when every selector key given matches; within a key, any one value is enough:

- ``vendors``, ``deviceIDs``: PCI IDs, hex, with or without ``0x``, any case (``15b3``, ``0x101B``);
- ``drivers``: the PCI function's driver (``mlx5_core``);
- ``ifNames``: any netdev of the HCA, the bond that carries its RoCE GIDs included (``ibs108``, ``bond0``);
- ``linkTypes``: the port's link layer, ``ether``/``ethernet``/``eth`` or ``infiniband``/``ib``, any case;
- ``rootDevices``: the PCI address (``0000:81:00.0``).

Mellanox's deprecated ``devices`` (the entry's key beside ``selectors``) is ``ifNames``. An empty
selector set matches every HCA, as in Mellanox's plugin.

    sel = parse_selectors({"linkTypes": ["infiniband"]}, "configList[0].selectors", "/etc/config.json")
    [h.id for h in hcas if sel.matches(h)]
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rdma_cni.devices.errors import ConfigError
from rdma_cni.devices.hca import ETHERNET, INFINIBAND, Hca, pci_id

LINK_TYPES = {
    "ether": ETHERNET,
    "ethernet": ETHERNET,
    "eth": ETHERNET,
    "infiniband": INFINIBAND,
    "ib": INFINIBAND,
}
_HEX_ID = re.compile(r"(0x)?[0-9a-fA-F]{4}")
_PCI_ADDRESS = re.compile(r"([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_NAME = re.compile(r"[^\s/]{1,64}")


@dataclass(frozen=True)
class Selectors:
    """Normalised selector values (``()`` = the key was not given)."""

    vendors: tuple[str, ...] = ()
    device_ids: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    if_names: tuple[str, ...] = ()
    link_types: tuple[str, ...] = ()  # "Ethernet" / "InfiniBand", as sysfs spells them
    root_devices: tuple[str, ...] = ()  # full PCI addresses, lower-case

    def matches(self, hca: Hca) -> bool:
        return all(
            not wanted or have
            for wanted, have in (
                (self.vendors, hca.vendor in self.vendors),
                (self.device_ids, hca.device_id in self.device_ids),
                (self.drivers, hca.driver in self.drivers),
                (self.if_names, any(n in self.if_names for n in hca.netdevs)),
                (self.link_types, hca.link_layer in self.link_types),
                (self.root_devices, hca.pci in self.root_devices),
            )
        )

    def describe(self) -> str:
        """For a log line: ``linkTypes=InfiniBand ifNames=ibs108``, or ``every HCA``."""
        parts = [f"{key}={','.join(values)}" for key, values in self._items() if values]
        return " ".join(parts) or "every HCA"

    def _items(self) -> list[tuple[str, tuple[str, ...]]]:
        return [
            ("vendors", self.vendors),
            ("deviceIDs", self.device_ids),
            ("drivers", self.drivers),
            ("ifNames", self.if_names),
            ("linkTypes", self.link_types),
            ("rootDevices", self.root_devices),
        ]


def _hex_id(value: str) -> str:
    if not _HEX_ID.fullmatch(value):
        raise ValueError
    return pci_id(value) or ""


def _link_type(value: str) -> str:
    found = LINK_TYPES.get(value.lower())
    if found is None:
        raise ValueError
    return found


def _root_device(value: str) -> str:
    if not _PCI_ADDRESS.fullmatch(value):
        raise ValueError
    value = value.lower()
    return value if value.count(":") == 2 else "0000:" + value


def _name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError
    return value


# file key -> (field, normaliser, fix)
KEYS = {
    "vendors": ("vendors", _hex_id, 'use PCI vendor IDs as hex strings, for example ["15b3"] (Mellanox)'),
    "deviceIDs": (
        "device_ids",
        _hex_id,
        'use PCI device IDs as 4-digit hex strings, for example ["101b"] (see `lspci -nn`)',
    ),
    "drivers": ("drivers", _name, 'use PCI driver names, for example ["mlx5_core"]'),
    "ifNames": ("if_names", _name, 'use netdev names, for example ["ibs108"] (see `ibdev2netdev`)'),
    "linkTypes": ("link_types", _link_type, "use ether (or ethernet) or infiniband (or ib)"),
    "rootDevices": ("root_devices", _root_device, 'use PCI addresses like "0000:81:00.0" (see `lspci -D`)'),
}


def parse_selectors(value: object, key: str, where: str) -> Selectors:
    """``value`` (the ``selectors`` mapping) checked and normalised; ConfigError names ``key.<k>``."""
    if not isinstance(value, dict):
        raise ConfigError(
            key,
            value,
            'use a mapping of selector to a list of values, for example {"linkTypes": ["infiniband"]}',
            where,
        )
    found: dict[str, tuple[str, ...]] = {}
    for name, values in value.items():
        spec = KEYS.get(str(name))
        if spec is None:
            raise ConfigError(
                f"{key}.{name}",
                values,
                "this plugin does not implement this selector; use "
                f"{', '.join(KEYS)} (an HCA matches when every one given matches)",
                where,
            )
        field, normalise, fix = spec
        found[field] = _values(values, f"{key}.{name}", normalise, fix, where)
    return Selectors(**found)


def parse_if_names(values: object, key: str, where: str) -> Selectors:
    """Mellanox's deprecated ``devices`` list: ``ifNames`` under another key."""
    _, normalise, fix = KEYS["ifNames"]
    return Selectors(if_names=_values(values, key, normalise, fix, where))


def _values(
    values: object, key: str, normalise: Callable[[str], str], fix: str, where: str
) -> tuple[str, ...]:
    if not isinstance(values, list) or not values:
        raise ConfigError(key, values, f"use a non-empty list of strings; {fix}", where)
    out = []
    for v in values:
        try:
            if not isinstance(v, str):
                raise ValueError
            out.append(normalise(v))
        except ValueError:
            raise ConfigError(key, v, fix, where) from None
    return tuple(dict.fromkeys(out))
