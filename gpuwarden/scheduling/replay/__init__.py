"""The one replay driver (:mod:`.driver`) and job model (:mod:`.jobs`) under the trace replays:
the Philly queue replay (:mod:`..replay_queue`), the mixed inference + training replay
(:mod:`..replay_mixed`) and what-if on a user's own history (:mod:`..whatif`)."""

from .driver import MAX_REPLAY_SECONDS, Replay, ReplayMetrics
from .jobs import REQUEST_FIELDS, JobModel, fresh_copy

__all__ = ["MAX_REPLAY_SECONDS", "REQUEST_FIELDS", "JobModel", "Replay", "ReplayMetrics", "fresh_copy"]
