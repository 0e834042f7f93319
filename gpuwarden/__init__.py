"""gpuwarden: an observability-first GPU fleet platform for Kubernetes."""

__version__ = "0.1.0"
