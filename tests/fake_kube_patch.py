"""Patches as the API server applies them, for ``tests/fake_kube_api.py`` and its webhook calls.

No kube-apiserver can run here; these are its three PATCH types over plain JSON: RFC 7386 merge
patch (``merge-patch+json``), strategic merge patch (``strategic-merge-patch+json``, treated as a
merge patch except a pod's ``spec.schedulingGates``, merged by name as the real one does; other
lists are replaced, which is what the fields gpuwarden patches do) and RFC 6902 JSON patch
(``json-patch+json``, also what an admission webhook answers). A PUT is the object itself.
"""

from __future__ import annotations

import copy

MERGE_PATCH, STRATEGIC_PATCH, JSON_PATCH = ("application/merge-patch+json", "application/strategic-merge-patch+json",
                                          "application/json-patch+json")


def updated_object(method: str, content_type: str, current: dict, body, plural: str) -> dict | tuple[int, str, str]:
    """The object a PUT or PATCH asks for, or the reason the server refuses the request itself."""
    if method == "PUT":
        return copy.deepcopy(body or {})
    if content_type == JSON_PATCH:
        try:
            return apply_json_patch(current, body)
        except (ValueError, KeyError, IndexError, TypeError) as error:
            return 422, "Invalid", f"the server rejected our request due to an error in our request: {error}"
    if content_type == STRATEGIC_PATCH and plural == "pods":
        body = _strategic_gates(current, body or {})
    elif content_type not in (MERGE_PATCH, STRATEGIC_PATCH):
        return 415, "UnsupportedMediaType", f"the fake does not speak {content_type}"
    return merge(copy.deepcopy(current), body or {})


def _strategic_gates(current: dict, patch: dict) -> dict:
    """A strategic merge patch's ``spec.schedulingGates`` (patchMergeKey name, strategy merge) as a whole list:
    listed gates are added or replaced, ``$patch: delete`` removes one, ``$patch: replace`` replaces the list.
    (Other lists are replaced, as a merge patch does.)"""
    spec = patch.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("schedulingGates"), list):
        return patch
    items = spec["schedulingGates"]
    gates = [dict(g) for g in (current.get("spec") or {}).get("schedulingGates") or ()]
    if {"$patch": "replace"} in items:
        gates = [i for i in items if i != {"$patch": "replace"}]
    for item in items if {"$patch": "replace"} not in items else ():
        names = [g.get("name") for g in gates]
        if item.get("$patch") == "delete":
            gates = [g for g in gates if g.get("name") != item.get("name")]
        elif item.get("name") in names:
            gates[names.index(item.get("name"))] = item
        else:
            gates.append(item)
    patch = copy.deepcopy(patch)
    patch["spec"] = {k: v for k, v in spec.items() if not k.startswith("$")} | {"schedulingGates": gates}
    return patch


def merge(target, patch):
    """RFC 7386 JSON merge patch (null removes a key; lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge(target.get(key), value)
    return target



# -- RFC 6902 JSON Patch over RFC 6901 pointers ---------------------------------------------------
def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc, parts: list[str]):
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _get(doc, path: str):
    parts = _pointer(path)
    return _parent(doc, parts + [""]) if parts else doc


def _add(doc, path: str, value):
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _parent(doc, parts), parts[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if not 0 <= index <= len(parent):
            raise IndexError(f"add at {path}: index out of range")
        parent.insert(index, value)
    else:
        parent[last] = value
    return doc


def _remove(doc, path: str):
    parts = _pointer(path)
    parent, last = _parent(doc, parts), parts[-1]
    return parent.pop(int(last) if isinstance(parent, list) else last)


def apply_json_patch(doc: dict, patch: list[dict]) -> dict:
    doc = copy.deepcopy(doc)
    if not isinstance(patch, list):
        raise ValueError("a JSON patch is a list of operations")
    for op in patch:
        kind, path = op.get("op"), op.get("path", "")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise ValueError(f"test at {path} failed")
        elif kind in ("move", "copy"):
            value = _remove(doc, op["from"]) if kind == "move" else copy.deepcopy(_get(doc, op["from"]))
            doc = _add(doc, path, value)
        else:
            raise ValueError(f"JSON patch op {kind!r} is not one of: add, remove, replace, test, move, copy")
    return doc

