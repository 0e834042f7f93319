"""Real traces turned into fleet samples, so the classifier runs on them unchanged.

``h200/phase_trace.csv`` (one H200, 0.2 s samples, labelled phases) maps column by column:

====================  =============================================================================
trace column          fleet samples column
====================  =============================================================================
``t`` (s)             ``timestamp`` = :data:`TRACE_EPOCH` + t
``gpu_util`` (%)      ``gpu_util_ratio`` = gpu_util / 100
``gpm_sm_util`` (%)   ``sm_active_ratio`` = gpm_sm_util / 100 (GPM SM activity)
``gpm_any_tensor_util``  ``tensor_active_ratio`` / 100; ``gpm_dram_bw_util`` -> ``dram_active_ratio`` / 100
``mem_used_mib``      ``mem_used_bytes`` = MiB * 2**20; ``mem_total_bytes`` = 143,771 MiB (``nvidia-smi -q``)
``power_w``, ``temp_c``, ``sm_clock_mhz``, ``clocks_event_reasons``
                      ``power_watts``, ``temperature_celsius``, ``sm_clock_mhz``, ``throttle_reasons_bitmask``
``n_procs``, memory   *allocated*: a pod holds the GPU when ``n_procs > 0`` or memory used is above
                      the driver's reserved baseline (the trace's minimum, 615 MiB, which is the
                      616 MiB ``Reserved`` of ``nvidia-smi -q``) by more than 64 MiB. Then ``pod`` =
                      ``phase-trace``, namespace/team ``lab``, project ``h200-phase-trace``.
``phase``             kept as an extra column (analytics ignores it)
====================  =============================================================================

``genai/`` (143 Alibaba inference pods, ~57 s samples): each ``container_ip`` is one pod on one GPU
of its own (the trace gives per-pod figures). ``pod_gpu_duty_cycle`` (%) -> ``gpu_util_ratio`` / 100
(the trace has no SM activity, so the classifier falls back to it, and says so per GPU);
``pod_gpu_memory_used_bytes`` -> ``mem_used_bytes``. A pod exists only where it has samples (no
filling before its first or after its last). The GPU model is not published: ``mem_total_bytes`` is
taken as 80 GiB (the largest value seen is 47 GiB) and the model as ``unknown (GenAI trace)``, so
this trace is classified without prices (``price=False``). ``timestamp_anon`` is read as Unix seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.fleet import SAMPLE_COLUMN_NAMES
from gpuwarden.fleet.traces import TraceError

TRACE_EPOCH = pd.Timestamp("2026-01-01T00:00:00Z")
H200_MEMORY_MIB = 143_771
ALLOCATED_MARGIN_MIB = 64
GENAI_MEMORY_TOTAL = 80 * 2**30
GENAI_MODEL = "unknown (GenAI trace)"


def _blank(rows: int) -> dict[str, object]:
    return {name: np.full(rows, np.nan) for name in SAMPLE_COLUMN_NAMES}


def phase_trace_samples(path: str | Path) -> pd.DataFrame:
    """``h200/phase_trace.csv`` as fleet samples (plus its ``phase`` column); see the module doc."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: trace file not found")
    trace = pd.read_csv(path)
    needed = {"t", "phase", "gpu_util", "gpm_sm_util", "mem_used_mib", "n_procs", "power_w"}
    missing = sorted(needed - set(trace.columns))
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
    rows = len(trace)
    baseline = float(trace["mem_used_mib"].min())
    allocated = (trace["n_procs"] > 0) | (trace["mem_used_mib"] > baseline + ALLOCATED_MARGIN_MIB)
    out = _blank(rows)
    out.update(
        timestamp=TRACE_EPOCH + pd.to_timedelta(trace["t"], unit="s"),
        cluster=["h200-lab"] * rows, node=["h200-lab-000"] * rows, gpu_uuid=["GPU-h200-phase-trace"] * rows,
        gpu_index=np.zeros(rows, dtype=np.int64), model=["NVIDIA H200"] * rows, mig_instance=[None] * rows,
        namespace=np.where(allocated, "lab", None), pod=np.where(allocated, "phase-trace", None),
        team=np.where(allocated, "lab", None), project=np.where(allocated, "h200-phase-trace", None),
        attribution=["known"] * rows,  # the trace lists the GPU's processes: "no process" is known
        gpu_util_ratio=trace["gpu_util"] / 100.0, sm_active_ratio=trace["gpm_sm_util"] / 100.0,
        tensor_active_ratio=trace.get("gpm_any_tensor_util", np.nan) / 100.0,
        dram_active_ratio=trace.get("gpm_dram_bw_util", np.nan) / 100.0,
        mem_used_bytes=trace["mem_used_mib"] * 2.0**20, mem_total_bytes=np.full(rows, H200_MEMORY_MIB * 2.0**20),
        power_watts=trace["power_w"], temperature_celsius=trace.get("temp_c", np.nan),
        sm_clock_mhz=trace.get("sm_clock_mhz", np.nan), throttle_reasons_bitmask=trace.get("clocks_event_reasons", np.nan),
    )
    frame = pd.DataFrame(out)
    frame["phase"] = trace["phase"].to_numpy()
    return frame


def genai_samples(data_dir: str | Path) -> pd.DataFrame:
    """The 143 GenAI inference pods as fleet samples (one GPU per pod); see the module doc."""
    folder = Path(data_dir) / "genai"
    frames = {}
    for name, file in (("duty", "pod_gpu_duty_cycle.csv.gz"), ("memory", "pod_gpu_memory_used_bytes.csv.gz")):
        path = folder / file
        if not path.is_file():
            raise TraceError(f"{path}: trace file not found")
        part = pd.read_csv(path)
        missing = sorted({"value", "timestamp_anon", "container_ip"} - set(part.columns))
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        frames[name] = part.groupby(["container_ip", "timestamp_anon"], sort=False)["value"].mean()
    # Pods are the ones with a duty cycle (a pod with memory samples only cannot be classified).
    duty = frames["duty"]
    memory = frames["memory"].reindex(duty.index)
    pods = duty.index.get_level_values(0).astype(str)
    rows = len(duty)
    out = _blank(rows)
    keys = pd.Categorical(pods)
    out.update(
        timestamp=pd.to_datetime(duty.index.get_level_values(1).to_numpy(dtype="float64"), unit="s", utc=True),
        cluster=["genai"] * rows, node=pd.Categorical.from_codes(keys.codes, [f"genai-{k[:12]}" for k in keys.categories]),
        gpu_uuid=pd.Categorical.from_codes(keys.codes, [f"GPU-genai-{k}" for k in keys.categories]),
        gpu_index=np.zeros(rows, dtype=np.int64), model=[GENAI_MODEL] * rows, mig_instance=[None] * rows,
        namespace=["genai"] * rows, pod=keys, team=["genai"] * rows, project=["inference"] * rows,
        attribution=["known"] * rows,
        gpu_util_ratio=np.clip(duty.to_numpy(dtype="float64") / 100.0, 0.0, 1.0),
        mem_used_bytes=memory.to_numpy(dtype="float64"), mem_total_bytes=np.full(rows, float(GENAI_MEMORY_TOTAL)),
    )
    return pd.DataFrame(out).sort_values("timestamp", kind="stable", ignore_index=True)
