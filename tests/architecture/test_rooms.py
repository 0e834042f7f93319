"""The rooms, from the code itself: every top-level package of gpuwarden is named by the layering
contracts in pyproject.toml (import-linter checks them: tests/architecture/test_layering.py), and no room has an
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


def test_the_picture_of_the_rooms_in_the_docs_is_the_import_graph():
    from rooms_graph import ROOT, room_imports

    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("<!-- rooms-table", 1)[1].split("<!-- /rooms-table -->", 1)[0]
    documented = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            documented[f"gpuwarden.{cells[0].strip('`')}"] = (
                set() if cells[2] == "none" else {f"gpuwarden.{r.strip()}" for r in cells[2].split(",")})
    assert documented == room_imports(build_graph())
