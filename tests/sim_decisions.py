"""Record the scheduling decisions applied to a small seeded simulated fleet, one line each.

``tests/recorded/dispatcher_seed7_8nodes_12h.txt`` was written by this module with the old
``sim/dispatch.Dispatcher`` scheduling the fleet: the simulator of main at 7180670 (``gpuwarden/sim``
and no ``cli/simfleet.py``) over the placement engine that replaced the old one (issue 22: the
shipped policy's FGD scorer; it picks other nodes among ties than the old best fit did), from a
tree holding both:

    git archive HEAD | tar -x -C T && rm -r T/gpuwarden/sim T/gpuwarden/cli/simfleet.py
    git archive 7180670 gpuwarden/sim | tar -x -C T
    cd T && PYTHONPATH=. GPUWARDEN_DATA=/path/to/shared/data python tests/sim_decisions.py > dispatcher_seed7_8nodes_12h.txt

(``GPUWARDEN_DATA``: a tree outside the checkout does not find the traces by itself.)

Re-recorded for issue 31 from the scheduling round on this tree (``python tests/sim_decisions.py``,
with ``GPUWARDEN_DATA`` set): up to 36,180 s the file is what the old dispatcher wrote, line for line;
there the dispatcher suspended speech/train-000250 for llm-pretrain/ft-000273, taking speech from
10.8 GPUs to 6.8, below its guarantee of 9, for llm-pretrain's borrowing (16 of its 9). The round
keeps guarantees as an invariant now and suspends llm-pretrain's own work instead.

It builds the fleet the way that commit did (``Simulation(config)``) when ``gpuwarden.cli.simfleet``
does not exist, else through it, so the same file states what the old dispatcher decided and what
the actuator's scheduling round decides now.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpuwarden.sim import SimConfig
from gpuwarden.sim import cluster as sim_cluster

HOURS = 12
CONFIG = dict(seed=7, nodes=8, warmup_days=0.0, fault_rate_scale=0.0, spot_reclaims_per_node_day=0.0,
              training_load=2.0)  # twice the training demand: suspends, preemptions and resumes happen


def line(now_s: float, action) -> str:
    """``<sim seconds> <kind> <namespace/name> <node>:<gpu uuid>[:<milli or MIG profile>]...``"""
    where = [f"{p['node']}:{p['gpu_uuid']}:{p.get('mig_profile', p.get('milli'))}"
             for p in action.params.get("placements", ())]
    return " ".join([f"{now_s:.0f}", action.kind.value, action.target, *where])


def record(data_dir: Path | None = None) -> list[str]:
    lines: list[str] = []
    real_apply = sim_cluster.SimCluster.apply

    def apply(self, action):
        result = real_apply(self, action)
        if result.ok:
            lines.append(line(self.sim.now_s, action))
        return result

    sim_cluster.SimCluster.apply = apply
    try:
        config = SimConfig(**CONFIG, data_dir=data_dir)
        try:
            from gpuwarden.cli.simfleet import simulated_fleet
        except ImportError:  # main at 7180670: the simulator scheduled itself
            from gpuwarden.sim import Simulation

            sim = Simulation(config)
        else:
            sim = simulated_fleet(config)
        for _ in range(int(HOURS * 3600 / config.step_seconds)):
            sim._advance(render=False)  # decisions only: no samples needed
    finally:
        sim_cluster.SimCluster.apply = real_apply
    return lines


if __name__ == "__main__":
    sys.stdout.write("\n".join(record()) + "\n")
