"""The ``Cluster`` protocol over the Kubernetes API, through the official ``kubernetes`` client.

The client classes are imported when first named: the rooms that read only this package's
annotation names (``.gates``: the scheduling round, also on the simulator) do not load the
``kubernetes`` client (a second of every simulated fleet's start-up)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import KubeApi, load_client
    from .failure import KubeFailure
    from .cluster import KubeCluster
    from .lease import LeaderElector

_MODULE_OF = {"KubeApi": "api", "KubeFailure": "failure", "load_client": "api", "KubeCluster": "cluster",
              "LeaderElector": "lease"}
__all__ = ["KubeApi", "KubeCluster", "KubeFailure", "LeaderElector", "load_client"]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
