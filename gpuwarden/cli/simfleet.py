"""The simulated fleet, scheduled: the CLI wires the actuator's scheduling round into the simulator.

The simulator carries decisions out and never makes them (``gpuwarden.sim`` imports nothing from
``scheduling`` or ``actuator``). Here, above both, a ``Simulation`` is built with the actuator's
``SchedulingRound`` -- the round a real cluster gets -- running on the simulation's own
``SimCluster``, and the config's ``scheduler_policy`` is checked against the scheduler's policies.
``demo``, ``sim generate``, ``exporter --backend sim``, ``health --sim`` and the benches build
their fleets here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwarden.sim import SimConfig, Simulation


def simulated_fleet(config: SimConfig | None = None) -> Simulation:
    """A ``Simulation`` of ``config`` scheduled by the actuator's round with its ``scheduler_policy``
    (imports the simulator only now: ``--help`` stays fast)."""
    from gpuwarden.scheduler.scheduling_round import SchedulingRound
    from gpuwarden.scheduling import POLICIES
    from gpuwarden.sim import SimConfig, Simulation

    config = config or SimConfig()
    config.check_policy(POLICIES)
    policy = config.scheduler_policy
    return Simulation(config, scheduling=lambda cluster: SchedulingRound(cluster, policy))
