"""The fields of an AdmissionReview the webhook reads, with their JSON types, and the check that a
review has them so (anything else: allowed, unchanged, logged)."""

from __future__ import annotations

from typing import Any

_QUANTITY = (str, int, float)
_CONTAINER = {"resources": {"requests": {"*": _QUANTITY}, "limits": {"*": _QUANTITY}}}
# Every field of an AdmissionReview's request the decision reads, with its JSON type: a type, a
# mapping of fields ("*": every value of a map), or a one-item list (every element). null is absent.
REVIEW_SHAPE: dict[str, Any] = {
    "uid": str, "kind": {"kind": str}, "operation": str, "namespace": str,
    "object": {
        "metadata": {"name": str, "generateName": str, "namespace": str, "labels": {"*": str},
                     "annotations": {"*": str}, "ownerReferences": [{"kind": str}]},
        "spec": {"nodeName": str, "schedulerName": str, "schedulingGates": [{"name": str}],
                 "containers": [_CONTAINER], "initContainers": [_CONTAINER],
                 "resourceClaims": [{"name": str, "resourceClaimName": str, "resourceClaimTemplateName": str}]},
    },
}
_JSON_NAMES = {str: "a string", int: "a number", float: "a number", bool: "true or false", list: "a list", dict: "an object"}


def shape_problem(value: object, shape: Any = REVIEW_SHAPE, where: str = "request") -> str | None:
    """The first field under ``where`` whose JSON type is not ``shape``'s, named; None when all are."""
    if value is None:
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where} is {_JSON_NAMES.get(type(value), 'something else')}, not an object"
        items = [(k, value.get(k), s) for k, s in shape.items() if k != "*"]
        items += [(str(k), v, shape["*"]) for k, v in value.items()] if "*" in shape else []
        return next((p for k, v, s in items if (p := shape_problem(v, s, f"{where}.{k}"))), None)
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is {_JSON_NAMES.get(type(value), 'something else')}, not a list"
        return next((p for i, v in enumerate(value) if (p := shape_problem(v, shape[0], f"{where}[{i}]"))), None)
    types = shape if isinstance(shape, tuple) else (shape,)
    if isinstance(value, bool) or not isinstance(value, types):
        return f"{where} is {_JSON_NAMES.get(type(value), 'something else')}, not {_JSON_NAMES[types[0]]}"
    return None
