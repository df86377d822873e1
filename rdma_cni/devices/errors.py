"""The device plugin's configuration error: kept apart from :mod:`~rdma_cni.devices.config` so
the readers of its parts (pool selectors, pool lists) raise the same one-sentence error."""

from __future__ import annotations


class ConfigError(Exception):
    """A setting the plugin cannot start with. ``str()`` is one sentence: key, bad value, fix."""

    def __init__(self, key: str, value: object, fix: str, where: str = "") -> None:
        self.key = key
        self.value = value
        self.fix = fix
        self.where = where
        super().__init__(self._sentence())

    def _sentence(self) -> str:
        place = f" in {self.where}" if self.where else ""
        return f"{self.key}{place} = {_shown(self.value)} is invalid: {self.fix.rstrip('.')}."


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
