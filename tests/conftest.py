"""Shared pytest fixtures. ``node_ns``: a node + switch netns pair from :mod:`netns`, removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from netns import Node, can_run, node


@pytest.fixture
def node_ns() -> Iterator[Node]:
    reason = can_run()
    if reason:
        pytest.skip(reason)
    with node() as n:
        yield n
