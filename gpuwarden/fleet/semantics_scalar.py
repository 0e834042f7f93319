"""The pandas-free part of :mod:`gpuwarden.fleet.semantics` (read the rules there): the MIG share
of a profile, counter increments over numpy arrays and a node's default pool. It stands apart
because the exporter imports :mod:`gpuwarden.fleet` (whose ``GpuRequest`` counts MIG shares) and
must never import pandas; import these names from :mod:`gpuwarden.fleet.semantics`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

DEFAULT_COMPUTE_SLICES = 7
# GPUs whose MIG mode splits into other than 7 compute slices, by a word of the model name.
_COMPUTE_SLICES_BY_MODEL_WORD: dict[str, int] = {"A30": 4}
# The compute slices of a profile: '3g.40gb', '1:3g.40gb' (instance id first), 'mig-3g.40gb'.
PROFILE_SLICES = re.compile(r"(?:^|[:/\s-])(\d+)g\.")
_POOL_ORDINAL = re.compile(r"-\d+$")

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def gpu_compute_slices(model: str | None) -> int:
    """Compute slices a GPU of ``model`` splits into under MIG (7 unless the model is known to
    differ; an unknown model counts as 7)."""
    if model:
        for word in str(model).replace("-", " ").split():
            if word in _COMPUTE_SLICES_BY_MODEL_WORD:
                return _COMPUTE_SLICES_BY_MODEL_WORD[word]
    return DEFAULT_COMPUTE_SLICES


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


def counter_increments(values: npt.ArrayLike, first: npt.ArrayLike) -> tuple[FloatArray, BoolArray]:
    """Increments of a cumulative counter per row, and where it was reset.

    Rows are sorted by (group, time); ``first`` is the index of each row's group's first row. A row
    compares with the last non-null value before it in its group; a drop means a reset, after which
    the new value counts from zero. Null rows and each group's first valid row add nothing.
    """
    v = np.asarray(values, dtype=np.float64)
    starts = np.asarray(first, dtype=np.int64)
    n = v.size
    inc = np.zeros(n, dtype=np.float64)
    reset = np.zeros(n, dtype=np.bool_)
    if n == 0:
        return inc, reset
    valid = ~np.isnan(v)
    last_valid = np.maximum.accumulate(np.where(valid, np.arange(n), -1))
    prev = np.empty(n, dtype=np.int64)
    prev[0] = -1
    prev[1:] = last_valid[:-1]
    prev[prev < starts] = -1
    has = valid & (prev >= 0)
    current = v[has]
    delta = current - v[prev[has]]
    dropped = delta < 0
    inc[has] = np.where(dropped, current, delta)
    reset[np.flatnonzero(has)[dropped]] = True
    return inc, reset


def group_first_rows(keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """For rows sorted by group, the index of each row's group's first row."""
    k = np.asarray(keys)
    n = len(k)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.ones(n, dtype=np.bool_)
    starts[1:] = k[1:] != k[:-1]
    return np.maximum.accumulate(np.where(starts, np.arange(n), 0)).astype(np.int64)


def default_pool(node: str) -> str:
    """A node's pool when no inventory names it: its name without a trailing ``-<number>``
    (``train-h100-007`` -> ``train-h100``); the whole name when that would leave nothing."""
    name = str(node)
    return _POOL_ORDINAL.sub("", name) or name


def default_pools(nodes: Iterable[str]) -> dict[str, str]:
    """:func:`default_pool` for each node name."""
    return {str(node): default_pool(str(node)) for node in nodes}
