"""Prometheus metrics live on a registry their owner is handed (or makes), never on
prometheus_client's global ``REGISTRY``: two owners in one process (two schedulers in a test, a
demo running the scheduler beside the actuator) then never collide with "Duplicated timeseries",
and each process serves the registry it built. ``gpuwarden/scheduler/scheduler_metrics.py`` is
the model: ``SchedulerMetrics(registry=None)`` makes a fresh ``CollectorRegistry``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import gpuwarden
from gpuwarden.scheduler.scheduler_metrics import SchedulerMetrics

PACKAGE = Path(gpuwarden.__file__).parent
METRIC_CLASSES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}

# Metrics still made on the global registry, by name, and why they are not moved yet. Moving one
# (an owner taking ``registry``, its command serving that registry) removes it from here.
ON_THE_GLOBAL_REGISTRY: dict[str, str] = {}


def _global_metrics(root: Path) -> dict[str, str]:
    """Every prometheus_client metric made without ``registry=`` under ``root``: its name -> file."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = {alias.asname or alias.name for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus_client")
                 for alias in node.names if alias.name in METRIC_CLASSES}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            made = (isinstance(func, ast.Name) and func.id in names) or (
                isinstance(func, ast.Attribute) and func.attr in METRIC_CLASSES
                and isinstance(func.value, ast.Name) and func.value.id in ("prometheus_client", "prom"))
            if made and not any(k.arg == "registry" for k in node.keywords):
                first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
                name = first.value if isinstance(first, ast.Constant) else f"<line {node.lineno}>"
                found[str(name)] = path.relative_to(root).as_posix()
    return found


def test_no_new_metric_is_made_on_the_global_registry():
    found = _global_metrics(PACKAGE)
    assert set(found) - set(ON_THE_GLOBAL_REGISTRY) == set(), (
        f"take a registry: CollectorRegistry in the owner (see scheduler_metrics.py): {found}")


def test_the_scan_sees_a_global_metric_and_not_collections_counter(tmp_path):
    (tmp_path / "a.py").write_text("from prometheus_client import Gauge, CollectorRegistry\n"
                                   "G = Gauge('a_global', 'x')\n"
                                   "R = CollectorRegistry()\n"
                                   "H = Gauge('a_owned', 'x', registry=R)\n")
    (tmp_path / "b.py").write_text("from collections import Counter\nC = Counter('abc')\n"
                                   "import prometheus_client\nS = prometheus_client.Summary('b_global', 'x')\n")
    assert _global_metrics(tmp_path) == {"a_global": "a.py", "b_global": "b.py"}


def test_two_scheduler_metrics_in_one_process_do_not_collide():
    first, second = SchedulerMetrics(), SchedulerMetrics()
    assert first.registry is not second.registry
    first.admissions.labels("team-a").inc(3)
    second.admissions.labels("team-a").inc()
    assert first.registry.get_sample_value("gpuwarden_scheduler_admissions_total", {"team": "team-a"}) == 3.0
    assert second.registry.get_sample_value("gpuwarden_scheduler_admissions_total", {"team": "team-a"}) == 1.0
    assert b"gpuwarden_queue_wait_seconds_bucket" in generate_latest(second.registry)


def test_the_registry_given_is_the_one_used_and_a_second_owner_on_it_collides():
    """What the global registry did to every second instance, and what a caller's registry still does."""
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    assert metrics.registry is registry
    metrics.last_round.set(7)
    assert registry.get_sample_value("gpuwarden_scheduler_last_round_timestamp_seconds") == 7.0
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        SchedulerMetrics(registry)
