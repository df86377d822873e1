"""What a plugin supplies to the dispatcher: one method per verb, nothing about the protocol.

A plugin is built lazily by a factory, so VERSION (and a malformed request) never pays for importing
netlink or pydantic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rdma_cni.cni.request import Request
from rdma_cni.cni.result import Result


class Plugin(Protocol):
    def add(self, req: Request) -> Result: ...

    def delete(self, req: Request) -> None: ...

    def check(self, req: Request) -> None: ...

    def gc(self, req: Request) -> None: ...

    def status(self, req: Request) -> None: ...


@dataclass(frozen=True)
class PluginSpec:
    """How the dispatcher knows a plugin: its name, how to build it, which CNI_ARGS keys it reads."""

    name: str
    factory: Callable[[], Plugin]
    known_args: frozenset[str] = frozenset()
    about: str = ""
