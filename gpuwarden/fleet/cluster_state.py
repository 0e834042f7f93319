"""The cluster kept as files: a ``ClusterSnapshot`` as JSON beside the store (every field of the
fleet vocabulary, encoded and decoded by type), the workload requests teams submit from the
portal, and the team weights admins set.

Fleet vocabulary, so every room may read it: whoever holds the ``Cluster`` (the demo's
``SimCluster``, the actuator's ``KubeCluster``) writes :func:`write_snapshot` each round; the
dashboard, in its own process, never talks to the cluster itself, and its Queue and Portal pages
plan on the newest snapshot with the scheduling room's own :func:`gpuwarden.scheduling.plan`.
Fields added to the vocabulary later are optional here: a file without them reads with their
defaults.

Files (default under ``<store>/cluster/``; ``GPUWARDEN_CLUSTER_STATE`` names another folder):
``snapshot.json`` (the snapshot), ``requests.jsonl`` (portal submissions, append-only, one JSON
object a line), ``team_weights.json`` (admin overrides of each team's fair-share weight).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import os
import types
import typing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collections.abc import Mapping

from .protocols import ClusterSnapshot, WorkloadPhase, WorkloadState
from .vocabulary import GpuRequest, PriorityClass, Workload, WorkloadKind

STATE_ENV = "GPUWARDEN_CLUSTER_STATE"
SCHEMA_VERSION = 1


def state_dir(store_path: str | None) -> Path | None:
    explicit = os.environ.get(STATE_ENV, "").strip()
    if explicit:
        return Path(explicit)
    return Path(store_path) / "cluster" if store_path else None


# -- a small typed JSON codec for the fleet's frozen dataclasses ------------------------------------


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (tuple, list, frozenset, set)):
        items = [_encode(v) for v in value]
        return sorted(items) if isinstance(value, (frozenset, set)) else items
    if isinstance(value, typing.Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    return value


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)  # slow: resolved once per class, not per object


def _decode(kind: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _decode(options[0], value) if options else value
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = _hints(kind)
        return kind(**{f.name: _decode(hints[f.name], value[f.name]) for f in dataclasses.fields(kind) if f.name in value})
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(value)
    if kind is datetime:
        return datetime.fromisoformat(value)
    if origin is tuple:
        inner = args[0] if args else Any
        return tuple(_decode(inner, v) for v in value)
    if origin is frozenset:
        return frozenset(_decode(args[0] if args else Any, v) for v in value)
    if origin in (typing.Mapping, dict, Mapping):
        inner = args[1] if len(args) == 2 else Any
        return {k: _decode(inner, v) for k, v in value.items()}
    return value


def snapshot_to_dict(snapshot: ClusterSnapshot) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "snapshot": _encode(snapshot)}


def snapshot_from_dict(document: Mapping[str, Any]) -> ClusterSnapshot:
    if document.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"cluster snapshot schema_version {document.get('schema_version')!r}; this dashboard reads "
                         f"{SCHEMA_VERSION}")
    snapshot: ClusterSnapshot = _decode(ClusterSnapshot, document["snapshot"])
    return snapshot


def write_snapshot(directory: str | os.PathLike[str], snapshot: ClusterSnapshot) -> Path:
    """Write ``snapshot.json`` atomically (a reader never sees half a file)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / ".snapshot.json.tmp"
    temporary.write_text(json.dumps(snapshot_to_dict(snapshot)))
    os.replace(temporary, directory / "snapshot.json")
    return directory / "snapshot.json"


def read_snapshot(directory: Path | None) -> ClusterSnapshot | None:
    """The newest snapshot, or None when there is none. A damaged file raises ValueError (one line)."""
    if directory is None or not (directory / "snapshot.json").exists():
        return None
    path = directory / "snapshot.json"
    try:
        return snapshot_from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a cluster snapshot this dashboard can read ({error})") from None


# -- portal requests ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WorkloadRequest:
    """What a team member asks for on the portal."""

    name: str
    team: str
    gpus: int = 1
    fraction_milli: int = 1000
    mig_profile: str | None = None
    priority_class: str = "normal"
    checkpointable: bool = False
    kind: str = "training"
    submitted_by: str = ""
    submitted_at: str = ""  # ISO-8601, the snapshot's clock

    def workload(self) -> Workload:
        """The fleet workload this request becomes (raises FleetValueError on a bad combination)."""
        return Workload(
            name=self.name, namespace=self.team, kind=WorkloadKind(self.kind), team=self.team, project=self.team,
            priority_class=PriorityClass(self.priority_class),
            gpus=GpuRequest(count=self.gpus, fraction_milli=self.fraction_milli, mig_profile=self.mig_profile),
            checkpointable=self.checkpointable, checkpoint_interval_seconds=1800.0 if self.checkpointable else None)


NAME_MAX_CHARS = 63  # a Kubernetes object name (DNS label)
FRACTION_STEP_MILLI = 100  # the portal offers 10 % steps
FRACTION_MIN_MILLI = 100


def request_limits(snapshot: ClusterSnapshot | None) -> tuple[int | None, list[str] | None, list[str]]:
    """(most whole GPUs one request may ask for: the cluster's GPUs; the MIG profiles its GPUs are
    cut into, the only ones a MIG request can be placed on, since the scheduler never re-cuts a
    GPU; its team names). Without a snapshot: no GPU bound, no profile bound (None), any team."""
    if snapshot is None or not snapshot.gpus:
        return None, None, []
    profiles = sorted({instance.profile for gpu in snapshot.gpus for instance in gpu.mig_instances})
    return len(snapshot.gpus), profiles, [t.name for t in snapshot.teams]


def validate_request(request: WorkloadRequest, snapshot: ClusterSnapshot | None = None) -> None:
    """Refuse a request the portal must not queue, with one line naming the field, the value and
    what is allowed (ValueError). Bounds come from the cluster (``request_limits``)."""
    max_gpus, profiles, teams = request_limits(snapshot)
    name = request.name
    allowed_chars = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    if not name or len(name) > NAME_MAX_CHARS or set(name) - allowed_chars or name[0] == "-" or name[-1] == "-":
        raise ValueError(f"workload name {name!r}: use 1..{NAME_MAX_CHARS} lower-case letters, digits and '-', "
                         "starting and ending with a letter or digit")
    if teams and request.team not in teams:
        raise ValueError(f"team {request.team!r}: not a team of this cluster; allowed: {', '.join(teams)}")
    gpus = request.gpus
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1 or (max_gpus is not None and gpus > max_gpus):
        bound = f"from 1 to {max_gpus} (the cluster's GPUs)" if max_gpus is not None else "of at least 1"
        raise ValueError(f"GPUs {gpus!r}: a whole number {bound}")
    fraction = request.fraction_milli
    if (not isinstance(fraction, int) or isinstance(fraction, bool) or not FRACTION_MIN_MILLI <= fraction <= 1000
            or fraction % FRACTION_STEP_MILLI):
        shown = f"{fraction / 10:g}%" if isinstance(fraction, (int, float)) else repr(fraction)
        raise ValueError(f"fraction of one GPU {shown}: from 10% to 100% in steps of 10%")
    if fraction < 1000 and request.gpus != 1:
        raise ValueError(f"fraction of one GPU {fraction / 10:g}% with {request.gpus} GPUs: a fraction asks for one GPU")
    if request.mig_profile is not None:
        if request.gpus != 1 or fraction != 1000:
            raise ValueError("MIG profile: a MIG request is one instance, not a count of GPUs or a fraction")
        if profiles is not None and request.mig_profile not in profiles:
            raise ValueError(f"MIG profile {request.mig_profile!r}: no GPU of this cluster is cut into it; allowed: "
                             + (", ".join(profiles) or "none (no GPU here has MIG)"))
    priorities = [p.value for p in PriorityClass]
    if request.priority_class not in priorities:
        raise ValueError(f"priority class {request.priority_class!r}: allowed: {', '.join(priorities)}")
    kinds = [k.value for k in WorkloadKind]
    if request.kind not in kinds:
        raise ValueError(f"workload kind {request.kind!r}: allowed: {', '.join(kinds)}")
    if not isinstance(request.checkpointable, bool):
        raise ValueError(f"checkpointable {request.checkpointable!r}: true or false")  # noqa: TRY004 - one error type for every bad field
    request.workload()  # and whatever else the fleet vocabulary refuses


def append_request(directory: Path, request: WorkloadRequest, snapshot: ClusterSnapshot | None = None) -> None:
    """Queue a portal request (appended to ``requests.jsonl``) once :func:`validate_request` accepts it."""
    validate_request(request, snapshot)  # refuse before anything is written
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "requests.jsonl").open("a") as handle:
        handle.write(json.dumps(dataclasses.asdict(request)) + "\n")


def read_requests(directory: Path | None, snapshot: ClusterSnapshot | None = None) -> tuple[list[WorkloadRequest], list[str]]:
    """Requests in submission order, and one line per line that could not be read or is out of
    the portal's bounds on ``snapshot``'s cluster (file:line and why)."""
    if directory is None or not (directory / "requests.jsonl").exists():
        return [], []
    path = directory / "requests.jsonl"
    requests, problems = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            request = WorkloadRequest(**json.loads(line))
            validate_request(request, snapshot)  # a hand-edited line is held to the portal's bounds too
            requests.append(request)
        except (ValueError, TypeError) as error:
            problems.append(f"{path}:{number}: skipped, not a workload request ({str(error).splitlines()[0][:80]})")
    return requests, problems


def with_requests(snapshot: ClusterSnapshot, requests: list[WorkloadRequest]) -> ClusterSnapshot:
    """The snapshot plus each request not already in it as a pending workload (same queue, same planner)."""
    known = {(w.workload.namespace, w.workload.name) for w in snapshot.workloads}
    added = []
    for request in requests:
        if (request.team, request.name) in known:
            continue
        submitted = datetime.fromisoformat(request.submitted_at) if request.submitted_at else snapshot.taken_at
        if submitted.tzinfo is None:
            submitted = submitted.replace(tzinfo=UTC)
        added.append(WorkloadState(request.workload(), WorkloadPhase.PENDING, min(submitted, snapshot.taken_at), None))
        known.add((request.team, request.name))
    return dataclasses.replace(snapshot, workloads=snapshot.workloads + tuple(added))


# -- team weights (admins only) ----------------------------------------------------------------------


def read_weights(directory: Path | None) -> dict[str, float]:
    if directory is None or not (directory / "team_weights.json").exists():
        return {}
    try:
        raw = json.loads((directory / "team_weights.json").read_text())
        return {str(k): float(v) for k, v in raw.items() if float(v) > 0}
    except (ValueError, TypeError, AttributeError):
        return {}


def write_weights(directory: Path, weights: dict[str, float]) -> None:
    bad = {k: v for k, v in weights.items() if not float(v) > 0}
    if bad:
        raise ValueError(f"team weights must be > 0: {bad}")
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / ".team_weights.json.tmp"
    temporary.write_text(json.dumps({k: float(v) for k, v in sorted(weights.items())}))
    os.replace(temporary, directory / "team_weights.json")


def with_weights(snapshot: ClusterSnapshot, weights: dict[str, float]) -> ClusterSnapshot:
    if not weights:
        return snapshot
    teams = tuple(dataclasses.replace(t, weight=weights.get(t.name, t.weight)) for t in snapshot.teams)
    return dataclasses.replace(snapshot, teams=teams)
