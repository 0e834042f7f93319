"""The rooms of gpuwarden and the import graph inside each, read with grimp (import-linter's own
graph builder), for tests/architecture/test_rooms.py and docs/architecture.md's picture."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "gpuwarden"


def rooms() -> list[str]:
    """Every top-level package of gpuwarden: a room."""
    return sorted(f"{PACKAGE}.{p.name}" for p in (ROOT / PACKAGE).iterdir() if (p / "__init__.py").is_file())


def contract_names() -> set[str]:
    """The modules the import-linter contracts in pyproject.toml name."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    named: set[str] = set()
    for contract in config:
        for key in ("layers", "source_modules", "forbidden_modules"):
            for entry in contract.get(key, ()):
                named.update(part.strip() for part in entry.split("|"))
    return named


def room_circles(graph: grimp.ImportGraph, room: str) -> list[list[str]]:
    """The import circles among the modules of ``room`` (a package's __init__ re-exporting its own
    modules is not one), one per strongly connected set, each as the modules in it, sorted."""
    packages = {room} | {m for m in graph.find_descendants(room) if graph.find_children(m)}
    modules = sorted((graph.find_descendants(room) | {room}) - packages)
    inside = set(modules)
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in inside and i != m) for m in modules}
    return [sorted(c) for c in _strongly_connected(edges) if len(c) > 1]


def _strongly_connected(edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (rooms have about 50 modules; recursion would do, but need not)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            targets = edges[node]
            if child < len(targets):
                work.append((node, child + 1))
                target = targets[child]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def build_graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None)


def room_imports(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """Each room and the other rooms it imports (any module of it, any module of theirs)."""
    found: dict[str, set[str]] = {room: set() for room in rooms()}
    for room in found:
        for module in graph.find_descendants(room) | {room}:
            for imported in graph.find_modules_directly_imported_by(module):
                other = ".".join(imported.split(".")[:2])
                if other in found and other != room:
                    found[room].add(other)
    return found
