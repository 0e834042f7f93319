"""The ``Cluster`` protocol over the Kubernetes API, through the official ``kubernetes`` client."""

from .api import KubeApi, KubeFailure, load_client
from .cluster import KubeCluster
from .lease import LeaderElector

__all__ = ["KubeApi", "KubeCluster", "KubeFailure", "LeaderElector", "load_client"]
