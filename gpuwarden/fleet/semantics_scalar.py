"""The pandas-free part of :mod:`gpuwarden.fleet.semantics` (read the rules there): the MIG share
of a profile and a node's default pool. It stands apart
because the exporter imports :mod:`gpuwarden.fleet` (whose ``GpuRequest`` counts MIG shares) and
must never import pandas or numpy (the exporter-only image has neither; lint-imports checks it).
The array rules (counter increments) live in :mod:`gpuwarden.fleet.semantics`; import every name
from there."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .gpu_catalogue import gpu_catalogue

# The compute slices of a profile: '3g.40gb', '1:3g.40gb' (instance id first), 'mig-3g.40gb'.
PROFILE_SLICES = re.compile(r"(?:^|[:/\s-])(\d+)g\.")
_POOL_ORDINAL = re.compile(r"-\d+$")

def gpu_compute_slices(model: str | None) -> int:
    """Compute slices a GPU of ``model`` splits into under MIG, from the GPU catalogue (4 on an A30,
    7 on A100 / H100 / H200 / B200); a model it does not know counts as its largest split (7)."""
    return gpu_catalogue().compute_slices(model)


def profile_slices(profile: str | None) -> int | None:
    """Compute slices named by a MIG profile, or None where none can be read."""
    if profile is None:
        return None
    match = PROFILE_SLICES.search(str(profile))
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def mig_share(profile: str | None, model: str | None = None, siblings: Sequence[str | None] | None = None) -> float:
    """Share of its GPU one row holds (see the module doc for the rule).

    ``siblings`` are the profiles of the GPU's *other* MIG instances at the same time: ``None``
    when they are not known, ``()`` when the instance is alone on its GPU.
    """
    if profile is None:
        return 1.0
    total = gpu_compute_slices(model)
    slices = profile_slices(profile)
    if slices is not None:
        return min(1.0, slices / total)
    if siblings is None:
        return 1.0 / total  # nothing known: one slice
    readable = [profile_slices(p) for p in siblings if p is not None]
    used = sum(min(1.0, s / total) for s in readable if s is not None)
    unreadable = 1 + sum(s is None for s in readable)
    return max(0.0, 1.0 - used) / unreadable


def request_gpu_equivalents(mig_profile: str | None, count: int = 1, fraction_milli: int = 1000,
                            model: str | None = None) -> float:
    """Whole-GPU equivalents a request holds: a MIG profile by its compute share, otherwise
    ``count`` GPUs of ``fraction_milli`` thousandths each."""
    if mig_profile is not None:
        return count * mig_share(mig_profile, model)
    return count * fraction_milli / 1000.0


def default_pool(node: str) -> str:
    """A node's pool when no inventory names it: its name without a trailing ``-<number>``
    (``train-h100-007`` -> ``train-h100``); the whole name when that would leave nothing."""
    name = str(node)
    return _POOL_ORDINAL.sub("", name) or name
