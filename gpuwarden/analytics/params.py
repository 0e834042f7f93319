"""The idle taxonomy's states and the classifier's thresholds, as one documented parameter object.

Every GPU-interval (one sample of one GPU or MIG instance, standing for the time since the previous
sample) lands in exactly one state:

``unallocated``
    no pod holds it (``pod`` is null) and attribution is known (``attribution`` is ``known``):
    capacity nobody asked for, or a fragment too small to use.
``idle_unattributed``
    nobody could know who holds it (no pod label and ``attribution`` is ``off``, ``failed`` or not
    recorded) and no kernels run (the ``allocated_idle`` test, without its hoarding sequel).
    *Unattributed* GPUs are never called unallocated: they are classified by activity alone into
    ``idle_unattributed``, ``fake_busy``, ``starved``, ``underutilized``, ``busy`` (or ``unmeasured``), and
    every report states their share of GPU-hours (``unattributed_share``).
``allocated_idle``
    held by a pod, no kernels running (activity below ``idle_activity``), for less than
    ``hoard_grace`` or with little memory in use (a CUDA context alone).
``hoarded``
    held, memory in use at or above ``hoard_mem_ratio`` of the GPU's memory, and no activity for
    longer than ``hoard_grace`` (the notebook or serving replica sitting on 64 GiB at 0%). The first
    ``hoard_grace`` of an idle stretch is ``allocated_idle``; the time after it is ``hoarded``.
``fake_busy``
    NVML utilisation reads busy (``>= fake_busy_util``) while GPM SM activity is below
    ``idle_activity`` (one-block kernels keep ``utilization.gpu`` at 22% with 0% of the SMs
    working). Only where SM activity is measured.
``starved``
    short bursts with long gaps: in the trailing window of ``window_samples`` samples at least
    ``starved_idle_share`` of the samples are idle while others run kernels (an input pipeline or
    a CPU that cannot keep the GPU fed). The idle samples between the bursts count here too. It
    needs evidence of a workload waiting: a pod holds the GPU and a burst reaches
    ``starved_burst_activity``; a GPU flickering at a few percent is idle or underutilised.
``underutilized``
    steady but low activity: the window's mean activity is below ``underutilized_below``.
``busy``
    everything else: steady activity at or above ``underutilized_below``.

*Activity* is GPM SM activity (``sm_active_ratio``) where the GPU measures it; elsewhere the
classifier falls back to NVML utilisation (``gpu_util_ratio``) and says so per GPU (see
``activity_source`` in the idle report). ``fake_busy`` cannot be seen without SM activity.

An allocated sample with neither SM activity nor NVML utilisation cannot be classified; it is
counted as ``unmeasured`` (a data-quality bucket, not a state of the taxonomy), so its hours and
cost still add up.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

import pandas as pd

from gpuwarden.fleet import FleetValueError


class IdleState(str, enum.Enum):
    UNALLOCATED = "unallocated"
    IDLE_UNATTRIBUTED = "idle_unattributed"  # idle, owner unknown (attribution off or failed)
    ALLOCATED_IDLE = "allocated_idle"
    HOARDED = "hoarded"
    FAKE_BUSY = "fake_busy"
    STARVED = "starved"
    UNDERUTILIZED = "underutilized"
    BUSY = "busy"
    UNMEASURED = "unmeasured"  # data quality: allocated, but no activity measurement at all

    @property
    def code(self) -> int:
        return STATE_CODES[self.value]


# The taxonomy in report order; ``unmeasured`` last and only where it occurs.
STATES: tuple[str, ...] = tuple(s.value for s in IdleState)
TAXONOMY: tuple[str, ...] = STATES[:-1]
STATE_CODES: dict[str, int] = {name: code for code, name in enumerate(STATES)}
# States in which an allocated GPU does (almost) no useful work: "idle by reason".
IDLE_REASONS: tuple[str, ...] = ("allocated_idle", "hoarded", "fake_busy", "starved")
# Idle GPU-hours in the fleet sense: the reasons above plus capacity nobody holds, plus idle
# GPUs whose holder nobody could see.
IDLE_STATES: tuple[str, ...] = ("unallocated", "idle_unattributed", *IDLE_REASONS)
# States whose GPU could be handed to someone else (the reclaim what-if's default).
RECLAIMABLE_STATES: tuple[str, ...] = ("unallocated", "allocated_idle", "hoarded")


class AnalyticsError(FleetValueError):
    """Bad analytics input or parameters; the message names the value and what is allowed.

    A :class:`~gpuwarden.fleet.FleetValueError`, so the CLI reports it as one line, exit 2."""


@dataclass(frozen=True)
class IdleParams:
    """Thresholds of the idle classifier (ratios are 0..1; times are pandas Timedeltas).

    The defaults suit 15-60 s scrapes; a sub-second trace (the H200 phase trace) passes a
    shorter ``hoard_grace``.
    """

    idle_activity: float = 0.02
    """Activity below this is "no kernels running" (SM activity, or NVML utilisation as fallback)."""
    fake_busy_util: float = 0.10
    """NVML utilisation at or above this, with SM activity below ``idle_activity``, is fake busy."""
    window_samples: int = 5
    """Trailing window (samples of the same GPU and holder) for burst and steadiness features."""
    idle_window_share: float = 1.0
    """An idle sample is plain idle (``allocated_idle`` / ``hoarded``) when at least this share of its
    window is idle; with fewer idle neighbours it is the gap of a bursty pattern."""
    starved_idle_share: float = 0.4
    """At least this share of idle samples in a window that also runs kernels is ``starved``."""
    starved_burst_activity: float = 0.10
    """``starved`` needs a pod on the GPU and, in the window, a burst at or above this activity: a
    workload waiting on input between real bursts, not a GPU flickering at a few percent."""
    underutilized_below: float = 0.5
    """Mean window activity below this is ``underutilized``; at or above it, ``busy``."""
    hoard_mem_ratio: float = 0.10
    """Memory used over memory total at or above this counts as holding memory."""
    hoard_grace: pd.Timedelta = pd.Timedelta(minutes=30)
    """Idle for longer than this while holding memory is ``hoarded``."""
    max_gap: pd.Timedelta | None = None
    """A longer silence between two samples of a GPU is missing data (default 3 x ``step``)."""
    step: pd.Timedelta | None = None
    """Nominal sample interval; inferred as the median interval when None."""

    def __post_init__(self) -> None:
        for name in ("idle_activity", "fake_busy_util", "idle_window_share", "starved_idle_share",
                     "starved_burst_activity", "underutilized_below", "hoard_mem_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
                raise AnalyticsError(f"IdleParams.{name}: {value!r} is not a ratio in 0..1")
        if not isinstance(self.window_samples, int) or self.window_samples < 1:
            raise AnalyticsError(f"IdleParams.window_samples: {self.window_samples!r} must be an integer >= 1")
        for name in ("hoard_grace", "max_gap", "step"):
            value = getattr(self, name)
            if value is None and name != "hoard_grace":
                continue
            try:
                stamp = pd.Timedelta(value)
            except (TypeError, ValueError):
                raise AnalyticsError(f"IdleParams.{name}: {value!r} is not a duration") from None
            if stamp < pd.Timedelta(0) or (name != "hoard_grace" and stamp <= pd.Timedelta(0)):
                raise AnalyticsError(f"IdleParams.{name}: {value!r} must be positive")
            object.__setattr__(self, name, stamp)

    def resolved_max_gap(self, step: pd.Timedelta) -> pd.Timedelta:
        return self.max_gap if self.max_gap is not None else 3 * step

    def to_dict(self) -> dict:
        out = asdict(self)
        for name in ("hoard_grace", "max_gap", "step"):
            value = out[name]
            out[name + "_seconds"] = None if value is None else pd.Timedelta(value).total_seconds()
            del out[name]
        return out
