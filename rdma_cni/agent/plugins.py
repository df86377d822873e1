"""Which plugin spec serves which executable name, looked up lazily so an absent plugin costs nothing.

The agent serves the same names the CNI executables carry; each maps to the module attribute the
executable itself dispatches with, so a call answered by the agent runs exactly the same code.
"""

from __future__ import annotations

import importlib
import logging

from rdma_cni.cni.plugin import PluginSpec

log = logging.getLogger("rdma-agent")

# executable name -> "module:attribute" of its PluginSpec
KNOWN: dict[str, str] = {
    "rdma-macvlan": "rdma_cni.cli.macvlan:SPEC",
    "rdma-ipvlan": "rdma_cni.cli.ipvlan:SPEC",
    "rdma-multus": "rdma_cni.cli.multus:SPEC",
}


class UnknownPlugin(LookupError):
    """The agent does not serve this name (the client then runs it in-process)."""


def resolve(target: str) -> PluginSpec:
    """``module:attribute`` -> the PluginSpec there; a module without that attribute is searched."""
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    found = getattr(module, attr, None) if attr else None
    if isinstance(found, PluginSpec):
        return found
    specs = [v for v in vars(module).values() if isinstance(v, PluginSpec)]
    if len(specs) == 1:
        return specs[0]
    raise UnknownPlugin(f"{target}: no single PluginSpec found in {module_name}")


class Registry:
    """Name -> spec, resolved on first use and kept, so the agent's workers inherit it warm."""

    def __init__(self, targets: dict[str, str] | None = None) -> None:
        self.targets = dict(KNOWN if targets is None else targets)
        self._specs: dict[str, PluginSpec] = {}

    def spec(self, name: str) -> PluginSpec:
        if name not in self._specs:
            target = self.targets.get(name)
            if target is None:
                raise UnknownPlugin(f"rdma-agent serves {sorted(self.targets)}, not {name!r}")
            self._specs[name] = resolve(target)
        return self._specs[name]

    def preload(self) -> list[str]:
        """Import every known plugin now (what makes the agent warm); returns the names that loaded."""
        loaded = []
        for name in self.targets:
            try:
                self.spec(name)
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop the others
                log.warning("plugin %s not served: %s", name, exc)
                continue
            loaded.append(name)
        return loaded
