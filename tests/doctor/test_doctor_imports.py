"""``rdma_cni.doctor``'s modules import each other one way only (issue 20, item 5): the node snapshot
(``node``, reading ``plugin_view``) is what every check reads, and no reader imports a check back.
Imports inside functions count too: a circle hidden in a function is still a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import rdma_cni.doctor

PACKAGE = "rdma_cni.doctor"


def doctor_imports() -> dict[str, set[str]]:
    """module -> the ``rdma_cni.doctor`` modules it imports anywhere in its text."""
    root = Path(rdma_cni.doctor.__file__).parent
    out: dict[str, set[str]] = {}
    for path in sorted(root.glob("*.py")):
        name = f"{PACKAGE}.{path.stem}" if path.stem != "__init__" else PACKAGE
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == PACKAGE:
                    found |= {f"{PACKAGE}.{a.name}" for a in node.names}
                elif node.module.startswith(PACKAGE + "."):
                    found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith(PACKAGE + ".")}
        out[name] = found - {name}
    return out


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (its modules in order), or [] when there is none."""
    state: dict[str, int] = {}
    trail: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        trail.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*trail[trail.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        trail.pop()
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []


def test_doctor_modules_import_each_other_one_way() -> None:
    graph = doctor_imports()
    assert f"{PACKAGE}.plugin_view" in graph[f"{PACKAGE}.node"]
    assert cycle(graph) == []
    # the snapshot and its reader import no check
    assert graph[f"{PACKAGE}.plugin_view"] == set()
    assert graph[f"{PACKAGE}.node"] == {f"{PACKAGE}.plugin_view"}
