"""Pod attribution is decided per exporter instance: a node with two exporters, one mapping pods
and one not, has its GPUs decided by the exporter that serves them."""

from __future__ import annotations

import pandas as pd

from gpuwarden.store.prometheus.attribution import PodAttribution

MAPPING, PLAIN = "10.0.0.1:9400", "10.0.0.2:9400"


def frame() -> pd.DataFrame:
    """dgx-1's GPU-a and GPU-b without a pod, and GPU-c holding one; dgx-2's GPU-d without."""
    return pd.DataFrame({"node": ["dgx-1", "dgx-1", "dgx-1", "dgx-2"], "gpu_uuid": ["GPU-a", "GPU-b", "GPU-c", "GPU-d"],
                         "pod": [None, None, "train-0", None], "attribution": pd.Categorical([None] * 4),
                         "state": ["idle_unattributed", "idle_unattributed", "busy", "idle_unattributed"]})


def rule() -> PodAttribution:
    out = PodAttribution("auto")
    # dcgm-exporter in Kubernetes mode serves GPU-a and GPU-c (with a pod label on GPU-c); a second,
    # host-level exporter without pod mapping serves GPU-b on the same node; dgx-2's series carry
    # no instance label (remote-written): their node stands in.
    out.learn([{"instance": MAPPING, "Hostname": "dgx-1", "UUID": "GPU-a"},
               {"instance": MAPPING, "Hostname": "dgx-1", "UUID": "GPU-c", "pod": "train-0"},
               {"instance": PLAIN, "Hostname": "dgx-1", "UUID": "GPU-b"},
               {"Hostname": "dgx-2", "UUID": "GPU-d"}], {MAPPING})
    return out


def test_each_gpu_is_decided_by_the_instance_that_serves_it():
    attribution = rule()
    out = [None if pd.isna(v) else v for v in attribution.apply(frame())["attribution"].astype(object)]
    # GPU-a: its exporter maps pods, so it is free; GPU-b: same node, but its exporter cannot see
    # pods, so its owner is unknown (per node, it would have been called free).
    assert out == ["known", None, "known", None]
    states = attribution.apply_states(frame())["state"].astype(object).tolist()
    assert states == ["unallocated", "idle_unattributed", "busy", "idle_unattributed"]
    note = attribution.note()
    assert note is not None and f"{PLAIN} (dgx-1)" in note and "node dgx-2" in note and "1 instance(s), 2 GPU(s)" in note


def test_the_override_still_wins():
    assert PodAttribution("on").apply(frame())["attribution"].astype(object).tolist() == ["known"] * 4
