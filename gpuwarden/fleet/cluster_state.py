"""The cluster kept as a file: a ``ClusterSnapshot`` as JSON beside the store (every field of the
fleet vocabulary, encoded and decoded by type).

Fleet vocabulary, so every room may read it: whoever holds the ``Cluster`` (the demo's
``SimCluster``, the actuator's ``KubeCluster``) writes :func:`write_snapshot` each round; the
dashboard, in its own process, never talks to the cluster itself: its Fleet and Actions pages read
the newest snapshot (the Queue and Request pages read the scheduler's live queue instead). Fields
added to the vocabulary later are optional here: a file without them reads with their defaults.

File (default under ``<store>/cluster/``; ``GPUWARDEN_CLUSTER_STATE`` names another folder):
``snapshot.json``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import os
import types
import typing
from datetime import datetime
from pathlib import Path
from typing import Any

from collections.abc import Mapping

from .errors import UserError
from .inputs import MAX_CONFIG_FILE_BYTES, checked_input
from .protocols import ClusterSnapshot

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


class ClusterStateError(UserError, ValueError):
    """A --cluster-state folder or snapshot.json that cannot be read: one line naming it."""


def read_snapshot(directory: Path | None) -> ClusterSnapshot | None:
    """The newest snapshot, or None when there is none yet. A damaged file, or a path that is not a
    folder (a file given where the folder of snapshot.json belongs), raises ClusterStateError (one line)."""
    if directory is None or not directory.exists():
        return None
    if not directory.is_dir():  # never silently "no snapshot": the user named the wrong thing
        raise ClusterStateError(f"{directory}: is not a folder; expected the folder the scheduler writes snapshot.json into")
    path = checked_input(directory / "snapshot.json", "", MAX_CONFIG_FILE_BYTES, missing_ok=True, raising=ClusterStateError)
    if path is None:
        return None
    try:
        return snapshot_from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as error:
        raise ClusterStateError(f"{path}: not a cluster snapshot this dashboard can read ({error})") from None
