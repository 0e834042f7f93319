"""The demo's live phase: its periodic jobs on the process's one runner, and what they read.

Jobs (each an APScheduler ``IntervalTrigger`` on the runner's clock, see :mod:`gpuwarden.fleet.runner`):

- ``live-step`` every ``--step-interval``: step the simulated fleet, collect it through the exporter,
  refresh the pod owners and let the embedded scraper read ``/metrics`` into the store, in that
  order (one simulated step, one scrape: the four are one job so they never interleave);
- ``compact`` every :data:`COMPACT_EVERY_STEPS` steps: merge the store's small live files;
- ``reconcile`` every :data:`RECONCILE_INTERVAL_S`: a health scan of the newest samples and the
  actuator's observe-mode round (:meth:`gpuwarden.remediation.Reconciler.register`).
"""

from __future__ import annotations

import urllib.request

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy rooms are imported when the demo runs, not when it parses
    from gpuwarden.remediation import Reconciler
    from gpuwarden.exporter import ExporterService
    from gpuwarden.fleet.runner import Runner
    from gpuwarden.sim import Simulation
    from gpuwarden.sim.cluster import SimCluster
    from gpuwarden.store import LocalStore
    from gpuwarden.store.scraper import Scraper

RECONCILE_INTERVAL_S = 30.0  # wall seconds between actuator rounds (30 simulated minutes at the default pace)
HEALTH_WINDOW_HOURS = 6.0  # samples each health scan reads
COMPACT_EVERY_STEPS = 60  # live steps between compactions of the store's small files


class HealthScan:
    """The actuator's source of findings: a health scan of the store's newest samples."""

    def __init__(self, store: LocalStore, simulation: Simulation) -> None:
        self.store = store
        self.now = lambda: simulation.now
        self.pools = {node.name: node.pool for node in simulation.nodes}
        self.dra = simulation.cluster.dra
        self.last: list = []

    def __call__(self, snapshot) -> list:
        import pandas as pd

        from gpuwarden.analytics.health import scan

        # The window ends at the fleet's clock, never at the newest sample.
        end = pd.Timestamp(self.now())
        start = end - pd.Timedelta(hours=HEALTH_WINDOW_HOURS)
        self.last = scan(self.store.read(start, end + pd.Timedelta(seconds=1)), pools=self.pools)
        # The dashboard's Queue & quotas and portal pages read the snapshot the actuator planned on.
        from gpuwarden.fleet import cluster_state

        cluster_state.write_snapshot(Path(self.store.root) / "cluster", snapshot)
        if self.dra is not None:  # a DRA fleet's objects beside it (gpuwarden demo --dra)
            from .demo_dra import write_objects

            write_objects(Path(self.store.root), self.dra)
        return self.last


class PodOwners:
    """Team and project of each simulated pod, as a real cluster's pod labels would give them; the
    scraper asks it for the pods it sees in ``/metrics`` (the exporter only knows namespaces)."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.owners: dict[str, tuple[str, str]] = {}

    def refresh(self) -> None:
        self.owners = {w.workload.name: (w.workload.team, w.workload.project) for w in self.cluster.snapshot().workloads}

    def __call__(self, namespace: str | None, pod: str | None) -> tuple[str | None, str | None]:
        if pod is None:
            return namespace, None
        owner = self.owners.get(pod) or self.owners.get(pod.rsplit("-", 1)[0])  # gang pods are <job>-<k>
        return owner or (namespace, None)


def add_live_jobs(runner: Runner, simulation: Simulation, exporter: ExporterService, scraper: Scraper,
                  owners: PodOwners, store: LocalStore, reconciler: Reconciler, step_interval_seconds: float) -> None:
    """Register the live phase's jobs (the module docstring lists them) with ``runner``."""
    from gpuwarden.fleet.triggers import every  # APScheduler: imported when the demo runs, not when it parses

    def live_step() -> None:
        simulation.step()
        exporter.collect_now()
        owners.refresh()
        scraper.scrape_once()

    runner.add("live-step", live_step, every(step_interval_seconds, runner.clock), at_once=True)
    runner.add("compact", store.compact, every(COMPACT_EVERY_STEPS * step_interval_seconds, runner.clock))
    reconciler.register(runner, at_once=False)  # the demo ran the first round before going live


# -- the demo's portal submissions (POST /submit on its queue server) ----------------------------------

DEMO_JOB_SECONDS = 3600.0  # how long a portal job runs in the simulation (a request names no duration)


def portal_submitter(simulation: Simulation, requested_by_annotation: str, templates_path=None):
    """``submit(request, identity) -> (workload key, message)`` adding a portal request (the same
    body the portal posts, checked against the same team templates a cluster's portal uses) to the
    simulated fleet as a workload that waits in the queue for the scheduling round; PortalError
    naming the field when the request leaves its team's template."""
    from gpuwarden.portal.submit import DEMO_TEMPLATES_PATH, PortalError, PortalRequest, load_templates, workload_of

    templates = load_templates(templates_path or DEMO_TEMPLATES_PATH)

    def submit(body, identity: str) -> tuple[str, str]:
        request = PortalRequest.from_mapping(body)
        template = templates.get(request.team)
        if template is None:
            raise PortalError(f"team {request.team!r}: no portal template; allowed: {', '.join(sorted(templates))}")
        with simulation.lock:
            taken = {job.name for job in simulation.jobs}
        name = next(f"{request.name}-{n}" for n in range(1, len(taken) + 2) if f"{request.name}-{n}" not in taken)
        workload = workload_of(request, template, name)  # what a Job named as Kubernetes' generateName would
        key = simulation.submit(workload, DEMO_JOB_SECONDS, annotations={requested_by_annotation: identity})
        return key, f"{key} submitted by {identity}; it waits in the queue until the scheduler admits it"

    return submit


def count_series(url: str) -> int:
    """Scrape our own exporter once, as Prometheus would, to report what it serves."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
    except OSError:
        return 0
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))
