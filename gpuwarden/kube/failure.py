"""The one failure an API call raises: its HTTP status (None: no answer) and whether a retry may help."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KubeFailure(Exception):
    status: int | None  # HTTP status; None for a timeout or a connection error
    message: str
    temporary: bool

    def __str__(self) -> str:
        return self.message

    @property
    def gone(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409
