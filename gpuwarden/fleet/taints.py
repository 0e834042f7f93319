"""Node taints and workload tolerations as kube-scheduler reads them, in the fleet's string form
(``key=value:Effect`` for a taint, as ``ClusterSnapshot.taints`` holds them)."""

from __future__ import annotations

HARD_TAINT_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule only steers kube-scheduler
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _parse_taint(text: str) -> tuple[str, str | None, str | None]:
    """``key=value:Effect`` (value and effect optional) as (key, value, effect)."""
    body, _, effect = text.partition(":")
    key, has_value, value = body.partition("=")
    return key, value if has_value else None, effect or None


def taint_object(text: str) -> dict[str, str]:
    """``key=value:Effect`` (value optional, effect required) as a Kubernetes Node taint object."""
    key, value, effect = _parse_taint(text)
    if not key or effect not in TAINT_EFFECTS:
        raise ValueError(f"taint {text!r} is not key=value:Effect ({', '.join(TAINT_EFFECTS)})")
    return {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}


def taint_blocks(taint: str, tolerations: tuple[str, ...]) -> bool:
    """Whether kube-scheduler keeps a pod with ``tolerations`` off a node with ``taint``: a
    NoSchedule or NoExecute taint that no toleration matches (same key, or none: every key; same
    value unless the toleration names none; same effect unless it names none)."""
    key, value, effect = _parse_taint(taint)
    if effect not in HARD_TAINT_EFFECTS:
        return False
    for toleration in tolerations:
        t_key, t_value, t_effect = _parse_taint(toleration)
        if t_key in ("", key) and t_value in (None, value) and t_effect in (None, effect):
            return False
    return True
