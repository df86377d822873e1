"""CNI spec versions this project speaks, and the comparisons the protocol needs.

Kept import-light on purpose: VERSION must answer without loading netlink or pydantic.
"""

from __future__ import annotations

SUPPORTED: tuple[str, ...] = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
CURRENT = "1.1.0"


def parse(version: str) -> tuple[int, int, int]:
    """``"1.0.0"`` -> ``(1, 0, 0)``; raises ``ValueError`` for anything that is not x.y.z."""
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a semantic version: {version!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def at_least(version: str, minimum: str) -> bool:
    return parse(version) >= parse(minimum)


def is_supported(version: str) -> bool:
    return version in SUPPORTED
