"""Drain modes: which pods of a node being drained go now, which are suspended first, which may finish.

The mode of a pod is the first of: its namespace's label ``gpuwarden.io/drain-mode``, the node's
label, the plan's default (by severity: a critical finding drains now, a warning cordons and waits,
:func:`gpuwarden.remediation.plan.drain_defaults`), ``immediate``:
- ``immediate``: evicted now (the Eviction API, so PodDisruptionBudgets hold);
- ``allow-completion``: left to finish until ``gpuwarden.io/drain-timeout-seconds`` (namespace or
  node label, else the plan's timeout) after the drain began (the node's
  ``gpuwarden.io/draining-since``), then evicted;
- ``suspend-first``: a pod of a checkpointable Job (``gpuwarden.io/checkpointable=true``) has its
  Job suspended (``spec.suspend``: its pods get their grace period to save) and is evicted only if
  still there after the suspend grace; every other pod is evicted now.
A pod whose ``spec.nodeName`` is not the node being drained is never touched, whatever a list
returned (a field selector an API server or proxy ignored must not drain the fleet).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from .api import Json, KubeApi
from .failure import NotFound

DRAIN_MODE_LABEL = "gpuwarden.io/drain-mode"
DRAIN_TIMEOUT_LABEL = "gpuwarden.io/drain-timeout-seconds"
DEFAULT_COMPLETION_SECONDS = 3600.0
DEFAULT_SUSPEND_GRACE_SECONDS = 120.0

class DrainMode(str, enum.Enum):
    IMMEDIATE = "immediate"
    ALLOW_COMPLETION = "allow-completion"
    SUSPEND_FIRST = "suspend-first"


def parse_mode(value: object, where: str) -> DrainMode:
    try:
        return DrainMode(str(value))
    except ValueError:
        allowed = ", ".join(m.value for m in DrainMode)
        raise ValueError(f"{where}: {DRAIN_MODE_LABEL}={value!r} is not one of: {allowed}") from None


def parse_seconds(value: object, where: str) -> float:
    try:
        seconds = float(str(value))
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{where}: {DRAIN_TIMEOUT_LABEL}={value!r} is not a number of seconds >= 0")
    return seconds


@dataclass(frozen=True)
class Setting:
    mode: DrainMode
    timeout_seconds: float


def setting(labels: Mapping[str, str], fallback: Setting, where: str) -> Setting:
    """The drain setting ``labels`` give, each key falling back to ``fallback``."""
    mode = parse_mode(labels[DRAIN_MODE_LABEL], where) if DRAIN_MODE_LABEL in labels else fallback.mode
    timeout = (parse_seconds(labels[DRAIN_TIMEOUT_LABEL], where) if DRAIN_TIMEOUT_LABEL in labels
               else fallback.timeout_seconds)
    return Setting(mode, timeout)


@dataclass
class DrainPlan:
    evict: list[Json] = field(default_factory=list)
    suspend_jobs: list[tuple[str, str]] = field(default_factory=list)  # (namespace, Job name)
    waiting: list[str] = field(default_factory=list)  # namespace/pod allowed to finish (or to save) for now
    left: int = 0  # DaemonSet and mirror pods
    foreign: list[str] = field(default_factory=list)  # listed, but on another node: never touched


def _job_of(pod: Json) -> str | None:
    return next((o.get("name") for o in pod["metadata"].get("ownerReferences") or () if o.get("kind") == "Job"), None)


def plan_drain(node: str, pods: list[Json], node_setting: Setting, namespace_labels: Mapping[str, Mapping[str, str]],
               checkpointable: Mapping[tuple[str, str], tuple[bool, bool]], elapsed_seconds: float,
               suspend_grace_seconds: float) -> DrainPlan:
    """What to do with each pod listed for ``node``, ``elapsed_seconds`` after the drain began.
    ``checkpointable``: (namespace, Job) -> (checkpointable, already suspended)."""
    out = DrainPlan()
    for pod in pods:
        meta = pod["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        if (pod.get("spec") or {}).get("nodeName") != node:
            out.foreign.append(f"{namespace}/{name}")
            continue
        daemon = any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or ())
        if daemon or "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            out.left += 1
            continue
        mode = setting(namespace_labels.get(namespace) or {}, node_setting, f"namespace {namespace}")
        job = _job_of(pod)
        if mode.mode == DrainMode.ALLOW_COMPLETION and elapsed_seconds < mode.timeout_seconds:
            out.waiting.append(f"{namespace}/{name}")
        elif mode.mode == DrainMode.SUSPEND_FIRST and job and checkpointable.get((namespace, job), (False, False))[0]:
            _, suspended = checkpointable[(namespace, job)]
            if not suspended and (namespace, job) not in out.suspend_jobs:
                out.suspend_jobs.append((namespace, job))
            if suspended and elapsed_seconds >= suspend_grace_seconds:
                out.evict.append(pod)  # still there after its grace: evicted like the rest
            else:
                out.waiting.append(f"{namespace}/{name}")
        else:
            out.evict.append(pod)
    return out


def jobs_to_read(node: str, pods: list[Json], node_setting: Setting,
                 namespace_labels: Mapping[str, Mapping[str, str]]) -> set[tuple[str, str]]:
    """(namespace, Job) whose checkpointable annotation a suspend-first drain must read."""
    out = set()
    for pod in pods:
        meta = pod["metadata"]
        namespace = meta.get("namespace", "")
        job = _job_of(pod)
        if job and (pod.get("spec") or {}).get("nodeName") == node and setting(
                namespace_labels.get(namespace) or {}, node_setting, f"namespace {namespace}").mode == DrainMode.SUSPEND_FIRST:
            out.add((namespace, job))
    return out


def drain_labels(api: KubeApi, namespace: str) -> dict[str, str]:
    """A namespace's labels (its drain mode and timeout); none for a namespace that is gone."""
    try:
        found = api.call(api.core.read_namespace, namespace, verb="get", resource="namespaces")
    except NotFound:
        return {}
    return dict(found["metadata"].get("labels") or {})
