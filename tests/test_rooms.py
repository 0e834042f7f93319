"""The rooms, from the code itself: every top-level package of gpuwarden is named by the layering
contracts in pyproject.toml (import-linter checks them: tests/test_layering.py), and no room has an
import circle (grimp's graph, the one import-linter reads; a TYPE_CHECKING import counts)."""

from __future__ import annotations

import grimp

from rooms_graph import build_graph, contract_names, room_circles, rooms


def test_the_contracts_name_every_room():
    assert set(rooms()) - contract_names() == set()
    assert {"gpuwarden.kube", "gpuwarden.remediation", "gpuwarden.scheduler", "gpuwarden.portal"} <= set(rooms())


def test_no_room_has_an_import_circle():
    graph = build_graph()
    assert {room: circles for room in rooms() if (circles := room_circles(graph, room))} == {}


def test_a_circle_is_found_and_a_package_reexporting_its_modules_is_not_one():
    graph = grimp.ImportGraph()
    for module in ("r", "r.a", "r.b", "r.c", "r.d", "r.sub", "r.sub.e"):
        graph.add_module(module)
    for importer, imported in (("r", "r.a"), ("r.a", "r"), ("r.a", "r.b"), ("r.b", "r.c"), ("r.c", "r.a"),
                               ("r.d", "r.a"), ("r.sub", "r.sub.e"), ("r.sub.e", "r.sub")):
        graph.add_import(importer=importer, imported=imported)
    assert room_circles(graph, "r") == [["r.a", "r.b", "r.c"]]
