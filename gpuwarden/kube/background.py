"""A view of the cluster a webhook replica keeps fresh on a thread of its own, never on a review's path."""

from __future__ import annotations

import threading
from typing import Self

from gpuwarden.fleet.clock import Clock


class BackgroundRefresh:
    """:meth:`refresh` once at :meth:`start`, then every ``refresh_seconds`` on ``clock`` until :meth:`stop`."""

    thread_name = "gpuwarden-refresh"

    def __init__(self, refresh_seconds: float, clock: Clock) -> None:
        self.refresh_seconds, self.clock = refresh_seconds, clock
        self._stopped = threading.Event()

    def refresh(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self.refresh()
        threading.Thread(target=self._loop, name=self.thread_name, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _loop(self) -> None:
        while not self.clock.wait(self._stopped, self.refresh_seconds):
            self.refresh()
