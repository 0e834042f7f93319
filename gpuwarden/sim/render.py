"""Rendering one step of the simulated fleet into fleet samples (one row per device).

Training / fine-tuning / notebook devices draw a real sample of their current H200 phase, scaled
to the device's model; inference devices follow a real GenAI pod's duty cycle; free devices draw
from ``idle_no_process``; active faults then bend the numbers. ``Renderer`` is mixed into
``Simulation`` and reads its device arrays.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuwarden.fleet import SAMPLE_COLUMNS, SAMPLE_COLUMN_NAMES, THROTTLE_REASONS
from gpuwarden.fleet.gpu_catalogue import gpu_catalogue

from .faults import SLOW_KINDS
from .workloads import PROFILES

FREE_MEMORY_BYTES = 615 * 1024**2  # what NVML reports used with no process (H200 trace)
# The recorded phases and GenAI pods ran on H200s: their numbers are scaled from this model's.
TRACE_GPU = gpu_catalogue().model("NVIDIA H200")
H200_TDP_WATTS = TRACE_GPU.tdp_watts
H200_MAX_SM_MHZ = float(TRACE_GPU.max_sm_clock_mhz)
IDLE_BIT = THROTTLE_REASONS["gpu_idle"]


class Renderer:
    """Fleet samples from the simulation's state (mixed into ``Simulation``)."""

    def _render(self, now: float) -> dict[str, np.ndarray]:
        rng, phases = self.rng, self.phases
        n = self.device_count
        gpu = self.dev_gpu
        job = self.dev_job
        allocated = job >= 0
        # Which phase each device is in: jobs draw one phase per step so a gang moves together.
        phase = np.full(n, phases.index("idle_no_process"))
        free = self._profile_names.index("free")
        if allocated.any():  # np.where evaluates both sides: with no job yet the lookup would index nothing
            profiles = np.where(allocated, self.job_profile.values[np.maximum(job, 0)], free)
        else:
            profiles = np.full(n, free)
        inference = profiles == self._profile_names.index("inference")
        job_phase = np.zeros(len(self.jobs), dtype=np.int64)
        for code in np.unique(profiles[allocated & ~inference]):
            mix = PROFILES[self._profile_names[code]]
            jobs_here = np.unique(job[profiles == code])
            draws = rng.choice(len(mix), size=jobs_here.size, p=np.array(list(mix.values())))
            job_phase[jobs_here] = np.array([phases.index(p) for p in mix])[draws]
        drawn = allocated & ~inference
        phase[drawn] = job_phase[job[drawn]]
        row = phases.offsets[phase] + (rng.random(n) * phases.counts[phase]).astype(int)
        rows = phases.rows
        util = rows["gpu_util"][row] / 100.0
        sm = rows["gpm_sm_util"][row] / 100.0
        tensor = rows["gpm_any_tensor_util"][row] / 100.0
        dram = rows["gpm_dram_bw_util"][row] / 100.0
        power = rows["power_w"][row].copy()
        temp = rows["temp_c"][row].copy()
        clock = rows["sm_clock_mhz"][row].copy()
        throttle = rows["clocks_event_reasons"][row].astype(np.int64)
        mem = np.full(n, float(FREE_MEMORY_BYTES))
        if allocated.any():
            job_mem = self.job_mem_ratio.values[job[allocated]]
            mem[allocated] = np.maximum(job_mem * self.dev_mem_total[allocated], FREE_MEMORY_BYTES)
            hoarding = allocated & (phase == phases.index("idle_memory_hoarded_64g"))
            mem[hoarding] = np.minimum(64 * 1024**3, 0.9 * self.dev_mem_total[hoarding])
        if inference.any():
            self._render_inference(np.flatnonzero(inference), util, sm, tensor, dram, power, clock, throttle, mem)
        # Scale the H200's numbers to each device's model, and MIG instances to their share.
        power = power * self.gpu_power_scale[gpu] * np.where(self.dev_is_mig, self.dev_share, 1.0)
        clock = clock * self.gpu_clock_scale[gpu]
        temp = temp + self.gpu_temp_offset[gpu]
        if self.config.background_noise:
            node = self.dev_node
            warm = np.clip((now - self.hot_node_start) / 1800.0, 0.0, 1.0) * (now < self.hot_node_end)
            temp = temp + self.node_temp_offset[node] + (self.hot_node_celsius * warm)[node]
        if self.config.node_conditions_per_node_day:
            self._render_node_conditions(now, util, power, temp, clock, throttle)
        mem = np.minimum(mem, self.dev_mem_total)
        self._render_faults(power, temp, clock, throttle)
        for event in self.active_faults:
            if event.kind.name in SLOW_KINDS and event.event_s <= now < event.ends_s:
                event.loaded_steps += int((util[self.dev_gpu == event.gpu] >= 0.5).any())
        no_gpm = ~self.gpu_gpm[gpu]
        sm[no_gpm] = tensor[no_gpm] = dram[no_gpm] = np.nan
        lost = self.gpu_lost[gpu]
        for values in (util, sm, tensor, dram, power, temp, clock, mem):
            values[lost] = np.nan
        throttle = np.where(lost, -1, throttle)
        pods = np.full(n, -1)
        claims = np.full(n, -1)
        if allocated.any():
            pods[allocated] = self.dev_pod[allocated]  # set when each job was bound
            claims[allocated] = self.dev_claim[allocated]
        columns = {
            "timestamp": np.full(n, int(now), dtype=np.int64),
            "device": np.arange(n),
            "job": job.copy(),
            "pod_code": pods,
            "claim_code": claims,
            "gpu_util_ratio": util,
            "sm_active_ratio": sm,
            "tensor_active_ratio": tensor,
            "dram_active_ratio": dram,
            "mem_used_bytes": mem,
            "power_watts": power,
            "temperature_celsius": temp,
            "sm_clock_mhz": clock,
            "throttle_reasons_bitmask": throttle,
        }
        for name, values in self.counters.items():
            columns[name] = values[gpu]
        return columns

    def _bind_claims(self, job, devices: np.ndarray) -> None:
        """On a DRA fleet, the claim each of ``devices`` is held through (its pod's, named by
        :meth:`~gpuwarden.sim.dra.SimDra.pod_claims`), for the samples' ``dra_claim``."""
        dra = self.cluster.dra
        if dra is None:
            return
        codes = np.array([self._claim_codes.setdefault(name, len(self._claim_codes)) for name in dra.pod_claims(job)])
        first_pod = int(self._job_pod_codes[job.index][0])
        self.dev_claim[devices] = codes[self.dev_pod[devices] - first_pod]

    def _render_inference(self, devices, util, sm, tensor, dram, power, clock, throttle, mem) -> None:
        """Inference follows a real GenAI pod: duty cycle -> NVML util; the rest derived from the
        H200 trace's busy phase scaled by the duty (sub-linear power, as measured)."""
        series_len = self.genai.duty_ratio.shape[1]
        specs = [self.jobs[j].spec for j in self.dev_job[devices]]
        series = np.array([s.genai_series for s in specs])
        offset = np.array([s.genai_offset for s in specs])
        fraction = np.array([min(1.0, s.workload.gpus.fraction_milli / 1000.0) for s in specs])
        t = (self.step_index + offset) % series_len
        duty = self.genai.duty_ratio[series, t]
        on_mig = self.dev_is_mig[devices]
        # A fractional pod that got a whole GPU (no MIG slice left) only uses its fraction of it.
        duty = np.where(on_mig, duty, duty * fraction)
        util[devices] = duty
        sm[devices] = duty * 0.8
        tensor[devices] = duty * 0.45
        dram[devices] = duty * 0.35
        power[devices] = 124.0 + (520.0 - 124.0) * duty**0.8  # idle context 124 W .. busy ~520 W
        clock[devices] = H200_MAX_SM_MHZ
        throttle[devices] = np.where(duty == 0, IDLE_BIT, 0)
        mem_ratio = self.genai.mem_used_bytes[series, t] / TRACE_GPU.memory_bytes
        mem[devices] = np.maximum(mem_ratio * self.dev_mem_total[devices] * 1.6, FREE_MEMORY_BYTES)

    def _render_faults(self, power, temp, clock, throttle) -> None:
        for event in self.active_faults:
            kind = event.kind.name
            if kind == "cooling_failure" and event.onset_s <= self.now_s < event.event_s:
                progress = (self.now_s - event.onset_s) / max(event.event_s - event.onset_s, 1.0)
                temp[np.flatnonzero(self.dev_gpu == event.gpu)] += 25.0 * progress  # warming at the same load
                continue
            if not (event.event_s <= self.now_s < event.ends_s):
                continue
            devices = np.flatnonzero(self.dev_gpu == event.gpu)
            if kind == "cooling_failure":
                temp[devices] += 25.0
                clock[devices] *= 0.6
                throttle[devices] |= THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_thermal_slowdown"]
            elif kind == "clock_straggler":
                clock[devices] *= 0.78  # power unchanged: nothing but the clock gives it away
            elif kind == "thermal_throttle":
                temp[devices] = 88.0 + self.rng.normal(0, 2.0, devices.size)
                clock[devices] *= 0.55
                throttle[devices] |= THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_thermal_slowdown"]
            elif kind == "power_brake":
                clock[devices] *= 0.4
                power[devices] *= 0.5
                throttle[devices] |= THROTTLE_REASONS["hw_power_brake_slowdown"] | THROTTLE_REASONS["hw_slowdown"]
            elif kind in ("straggler", "silent_straggler"):
                clock[devices] *= 0.8
                power[devices] *= 0.85

    def _frame(self, columns: dict[str, np.ndarray]) -> pd.DataFrame:
        """Columnar step output -> fleet samples frame (strings as categoricals built from codes)."""
        device = columns.pop("device")
        job = columns.pop("job")
        pod_code = columns.pop("pod_code")
        claim_code = columns.pop("claim_code")
        stamp = self.origin + pd.to_timedelta(columns.pop("timestamp"), unit="s")
        node_code = self.dev_node[device]
        gpu_code = self.dev_gpu[device]
        team_names, project_names = self._team_names, list(self._project_names)
        team_code = np.where(job >= 0, self.job_team.values[np.maximum(job, 0)], -1) if len(self.jobs) else np.full(job.size, -1)
        project_code = np.where(job >= 0, self.job_project.values[np.maximum(job, 0)], -1) if len(self.jobs) else np.full(job.size, -1)
        models = [g.model for g in self.gpus]
        model_names = self.model_names
        model_code = np.array([model_names.index(m) for m in models])[gpu_code]
        mig_names = sorted({m for m in self._mig_labels if m})
        mig_code = np.array([mig_names.index(m) if m else -1 for m in self._mig_labels])[device]
        frame = {
            "timestamp": pd.DatetimeIndex(stamp).tz_convert("UTC") if pd.DatetimeIndex(stamp).tz else pd.DatetimeIndex(stamp).tz_localize("UTC"),
            "cluster": pd.Categorical.from_codes(np.zeros(device.size, dtype=int), [self.config.cluster]),
            "node": pd.Categorical.from_codes(node_code, self._node_names),
            "gpu_uuid": pd.Categorical.from_codes(gpu_code, self._gpu_uuids),
            "gpu_index": np.array([g.index for g in self.gpus])[gpu_code],
            "model": pd.Categorical.from_codes(model_code, model_names),
            "mig_instance": pd.Categorical.from_codes(mig_code, mig_names),
            "namespace": pd.Categorical.from_codes(team_code, team_names),
            "pod": pd.Categorical.from_codes(pod_code, self._pod_names),
            "dra_claim": pd.Categorical.from_codes(claim_code, list(self._claim_codes)),
            "team": pd.Categorical.from_codes(team_code, team_names),
            "project": pd.Categorical.from_codes(project_code, project_names),
        }
        frame.update(columns)
        if not self.node_attributed.all():
            # Nodes without attribution: nobody could see the pods, so the pod columns are null.
            unattributed = ~self.node_attributed[node_code]
            for name in ("namespace", "pod", "dra_claim", "team", "project"):
                codes = frame[name].codes.copy()
                codes[unattributed] = -1
                frame[name] = pd.Categorical.from_codes(codes, frame[name].categories)
        out = pd.DataFrame(frame)
        out["throttle_reasons_bitmask"] = out["throttle_reasons_bitmask"].astype("Int64").mask(out["throttle_reasons_bitmask"] < 0)
        out.insert(list(out.columns).index("power_watts"), "mem_total_bytes", self.dev_mem_total[device])
        # Allocation is known where the node's kubelet answers (SimConfig.attribution), else 'off'.
        out["attribution"] = pd.Categorical.from_codes(np.where(self.node_attributed[node_code], 0, 1), ["known", "off"])
        for column in SAMPLE_COLUMNS:
            if column.name not in out.columns:  # not simulated: not measured (null), never a fake 0
                out[column.name] = pd.Series(np.nan, index=out.index, dtype="Int64" if column.kind == "int" else "float64")
        return out[list(SAMPLE_COLUMN_NAMES)]

