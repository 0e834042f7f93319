"""Cordons and taints with an owner: what gpuwarden records on a node when it takes it out of
scheduling, and the rule that it lifts only what it set.

Two annotations on the Node, each JSON:
- ``gpuwarden.io/cordoned``: ``{"by": "gpuwarden", "finding": ..., "at": ISO time}``, written in the
  same PATCH that sets ``spec.unschedulable`` (with the read ``resourceVersion``, so a cordon set by
  someone between our read and our write is a 409, re-read, and seen as theirs);
- ``gpuwarden.io/tainted``: ``{"KEY:EFFECT": {"by", "finding", "at"}}``, one entry per taint it put on.
A cordon or taint present before gpuwarden acted is never claimed: an undo, a repair or an untaint
of "all" leaves it, and the refusal names who may lift it. Pure functions over the Node as JSON, so
the handlers in :mod:`.cluster` and the repair planner share one reading.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .api import Json

OWNER = "gpuwarden"
CORDON_ANNOTATION = "gpuwarden.io/cordoned"
TAINTS_ANNOTATION = "gpuwarden.io/tainted"
DRAINING_ANNOTATION = "gpuwarden.io/draining-since"  # when a drain first cordoned it: allow-completion counts from here



def _annotations(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("annotations") or {}


def _decode(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return None  # an annotation someone edited by hand into nonsense is not ours


def mark(finding: str, at: datetime) -> Json:
    return {"by": OWNER, "finding": finding, "at": at.isoformat()}


def cordon_owner(annotations: Mapping[str, str]) -> Json | None:
    """gpuwarden's record of its cordon, or None when the cordon (if any) is someone else's."""
    record = _decode(annotations.get(CORDON_ANNOTATION))
    return record if isinstance(record, dict) and record.get("by") == OWNER else None


def owned_taints(annotations: Mapping[str, str]) -> dict[str, Json]:
    """``KEY:EFFECT`` -> gpuwarden's record, for each taint gpuwarden put on."""
    records = _decode(annotations.get(TAINTS_ANNOTATION))
    if not isinstance(records, dict):
        return {}
    return {k: v for k, v in records.items() if isinstance(v, dict) and v.get("by") == OWNER}


def taint_id(taint: Mapping[str, Any]) -> str:
    return f"{taint.get('key')}:{taint.get('effect')}"


def cordon_patch(node: Json, finding: str, at: datetime) -> tuple[Json, bool]:
    """The PATCH that cordons ``node`` and whether gpuwarden owns the cordon afterwards: a node
    already unschedulable without our record stays someone else's (we record nothing)."""
    spec = node.get("spec") or {}
    base: Json = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]}}
    if cordon_owner(_annotations(node)) is not None:
        return {**base, "spec": {"unschedulable": True}}, True
    if spec.get("unschedulable"):
        return base, False
    record = json.dumps(mark(finding, at))
    return {"metadata": {**base["metadata"], "annotations": {CORDON_ANNOTATION: record}},
            "spec": {"unschedulable": True}}, True


def uncordon_patch(node: Json) -> Json:
    """The PATCH that lifts gpuwarden's cordon; ValueError naming the owner when it is not ours."""
    name = node["metadata"]["name"]
    annotations = _annotations(node)
    ours = cordon_owner(annotations) is not None
    if not (node.get("spec") or {}).get("unschedulable"):  # lifted already: drop our stale record only
        return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"],
                             "annotations": {CORDON_ANNOTATION: None, DRAINING_ANNOTATION: None} if ours else {}}}
    if not ours:
        raise ValueError(f"{name} was cordoned by someone else (no {CORDON_ANNOTATION} annotation by {OWNER}); "
                         f"gpuwarden lifts only cordons it set: uncordon it yourself (kubectl uncordon {name}) "
                         "once its owner agrees")
    return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"],
                         "annotations": {CORDON_ANNOTATION: None, DRAINING_ANNOTATION: None}},
            "spec": {"unschedulable": None}}


def taint_patch(node: Json, taint: Json, finding: str, at: datetime) -> Json:
    """The PATCH that puts ``taint`` on; a taint of that key and effect already there is someone
    else's unless our record names it, and is left as it is."""
    taints = list((node.get("spec") or {}).get("taints") or ())
    owned = owned_taints(_annotations(node))
    ident = taint_id(taint)
    present = [t for t in taints if taint_id(t) == ident]
    meta: Json = {"resourceVersion": node["metadata"]["resourceVersion"]}
    if present and ident not in owned:
        return {"metadata": meta}  # theirs: not replaced, not claimed
    owned[ident] = owned.get(ident) or mark(finding, at)
    meta["annotations"] = {TAINTS_ANNOTATION: json.dumps(owned, sort_keys=True)}
    return {"metadata": meta, "spec": {"taints": [t for t in taints if taint_id(t) != ident] + [taint]}}


def untaint_patch(node: Json, taint: Json | None) -> tuple[Json, list[str]]:
    """The PATCH that removes ``taint`` (None: every taint gpuwarden put on) and the taints left
    because they are someone else's; ValueError when the one named is not ours."""
    name = node["metadata"]["name"]
    taints = list((node.get("spec") or {}).get("taints") or ())
    owned = owned_taints(_annotations(node))
    present = {taint_id(t) for t in taints}
    if taint is not None:
        ident = taint_id(taint)
        if ident in present and ident not in owned:
            raise ValueError(f"taint {ident} on {name} was set by someone else (not in its {TAINTS_ANNOTATION} "
                             f"annotation); gpuwarden removes only taints it set")
        removing = {ident}
    else:
        removing = set(owned)
    kept = [taint_id(t) for t in taints if taint_id(t) not in owned and taint_id(t) not in removing]
    remaining = {k: v for k, v in owned.items() if k not in removing}
    meta: Json = {"resourceVersion": node["metadata"]["resourceVersion"],
                  "annotations": {TAINTS_ANNOTATION: json.dumps(remaining, sort_keys=True) if remaining else None}}
    return {"metadata": meta, "spec": {"taints": [t for t in taints if taint_id(t) not in removing]}}, kept


def parse_since(text: str | None) -> datetime | None:
    """An ISO time from one of these annotations; None when absent or not a time."""
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
