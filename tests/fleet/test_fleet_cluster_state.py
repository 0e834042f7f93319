"""The cluster-snapshot JSON codec is fleet vocabulary: every field of the snapshot, the ones the
scheduling round needs included, survives a file; a file written before they existed still reads."""

from __future__ import annotations

import json
from dataclasses import replace


from builders import node, snapshot, workload
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.fleet import WorkloadPhase
from gpuwarden.fleet import cluster_state as cs
from gpuwarden.sim import SimConfig


def test_the_scheduling_facts_survive_the_file(tmp_path):
    job = workload("a", phase=WorkloadPhase.RUNNING, on="node-0", attained_gpu_seconds=5400.0)
    job = replace(job, workload=replace(job.workload, pools=("train",), tolerations=("gpuwarden.io/unhealthy",)))
    unshared = replace(node("node-0"), shares_gpus=False)
    written = snapshot([unshared, node("node-1")], [job], taints={"node-1": ("gpuwarden.io/unhealthy=true:NoSchedule",)})
    cs.write_snapshot(tmp_path, written)
    read = cs.read_snapshot(tmp_path)
    assert read == written
    assert read.workloads[0].attained_gpu_seconds == 5400.0 and read.workloads[0].workload.pools == ("train",)
    assert read.workloads[0].workload.tolerations == ("gpuwarden.io/unhealthy",)
    assert [n.shares_gpus for n in read.nodes] == [False, True]


def test_a_file_without_the_new_fields_reads_with_their_defaults(tmp_path):
    document = cs.snapshot_to_dict(snapshot([node("node-0")], [workload("a", on="node-0")]))
    body = document["snapshot"]
    for state in body["workloads"]:
        del state["attained_gpu_seconds"], state["workload"]["pools"], state["workload"]["tolerations"]
    for entry in body["nodes"]:
        del entry["shares_gpus"]
    (tmp_path / "snapshot.json").write_text(json.dumps(document))
    read = cs.read_snapshot(tmp_path)
    assert read.workloads[0].attained_gpu_seconds == 0.0 and read.workloads[0].workload.pools == ()
    assert read.nodes[0].shares_gpus is True


def test_the_simulated_cluster_round_trips(tmp_path, data_dir):
    sim = simulated_fleet(SimConfig(nodes=4, warmup_days=0.1, data_dir=data_dir))
    written = sim.cluster.snapshot()
    assert any(w.attained_gpu_seconds > 0 for w in written.workloads)
    cs.write_snapshot(tmp_path, written)
    assert cs.read_snapshot(tmp_path) == written

