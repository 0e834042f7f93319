"""The live scheduler: one scheduling round (snapshot -> the engine's plan -> the invariants verified
-> actions through the ``Cluster`` protocol), the service that runs it on a clock, its queue server
and its metrics. The decisions are :mod:`gpuwarden.scheduling`'s (the engine, also every replay's);
this room runs them against a cluster, which the CLI hands in (Kubernetes or the simulator)."""
