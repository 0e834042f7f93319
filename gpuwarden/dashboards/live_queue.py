"""The scheduler's live queue, for the Queue and Request pages: ``GET {GPUWARDEN_SCHEDULER_URL}/queue``.

The scheduler (``gpuwarden scheduler run``, or the demo's loop) serves the queue it planned in its
last round as JSON: ``taken_at``, ``policy``, ``round``, ``teams`` (guaranteed, burst, allocated,
borrowed, lent and pending GPUs per team) and ``workloads`` (each waiting workload's position,
reason and estimated start). The dashboard never plans a queue itself: without the variable, or
when the scheduler does not answer, the pages say so in one line (there is no file to fall back on
that a cluster would keep fresh). Answers are kept :data:`QUEUE_TTL_S` seconds, so the pages of one
refresh ask once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NoReturn

import pandas as pd
import streamlit as st

from gpuwarden.portal.submit import PortalError
from gpuwarden.portal.submitters import SCHEDULER_URL_ENV, http_json

QUEUE_TTL_S = 5
TIMEOUT_SECONDS = 3.0  # a page waits at most this long for a scheduler that does not answer
TEAM_COLUMNS = ("team", "guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "borrowed_gpus", "lent_gpus",
                "pending_workloads", "pending_gpus")
WORKLOAD_COLUMNS = ("position", "workload", "namespace", "name", "team", "priority_class", "gpus", "shape", "state",
                    "waiting_seconds", "reason", "estimated_start", "requested_by")


class QueueUnavailable(Exception):
    """The scheduler did not answer, or not with the queue; one line naming the URL."""


@dataclass(frozen=True)
class LiveQueue:
    url: str
    taken_at: pd.Timestamp
    policy: str
    round: int
    teams: pd.DataFrame  # TEAM_COLUMNS, one row per team
    workloads: pd.DataFrame  # WORKLOAD_COLUMNS, in queue order

    def held_gpus(self, team: str) -> float:
        """GPUs the team has running (allocated) or waiting: what a template's maxGpus counts."""
        rows = self.teams[self.teams["team"] == team]
        return float((rows["allocated_gpus"] + rows["pending_gpus"]).sum())

    def find(self, workload: str) -> dict[str, Any] | None:
        rows = self.workloads[self.workloads["workload"] == workload]
        return None if rows.empty else dict(rows.iloc[0])


def scheduler_url() -> str | None:
    return os.environ.get(SCHEDULER_URL_ENV, "").strip().rstrip("/") or None


def parse(document: Any, url: str) -> LiveQueue:
    """The queue JSON as tables; ValueError naming the first key the contract needs and it lacks."""
    where = f"{url}/queue"
    if not isinstance(document, dict):
        raise ValueError(f"{where}: not a queue (a JSON object with taken_at, policy, round, teams, workloads)")
    for key in ("taken_at", "policy", "round", "teams", "workloads"):
        if key not in document:
            raise ValueError(f"{where}: no {key!r} in the answer")

    def table(key: str, columns: tuple[str, ...]) -> pd.DataFrame:
        rows = document[key]
        if not isinstance(rows, list):
            raise ValueError(f"{where}: {key!r} is not a list")
        for i, row in enumerate(rows):
            missing = [c for c in columns if not isinstance(row, dict) or c not in row]
            if missing:
                raise ValueError(f"{where}: {key}[{i}] has no {missing[0]!r}")
        return pd.DataFrame([{c: row[c] for c in columns} for row in rows], columns=list(columns))

    workloads = table("workloads", WORKLOAD_COLUMNS).sort_values("position", kind="stable").reset_index(drop=True)
    workloads["estimated_start"] = pd.to_datetime(workloads["estimated_start"], utc=True, format="ISO8601")
    try:
        taken_at = pd.Timestamp(document["taken_at"])
    except (TypeError, ValueError):
        raise ValueError(f"{where}: taken_at {document['taken_at']!r} is not an ISO-8601 time") from None
    return LiveQueue(url, taken_at.tz_localize("UTC") if taken_at.tzinfo is None else taken_at.tz_convert("UTC"),
                     str(document["policy"]), int(document["round"]), table("teams", TEAM_COLUMNS), workloads)


@st.cache_data(ttl=QUEUE_TTL_S, show_spinner=False)
def _answer(url: str) -> Any:
    try:
        status, document = http_json(f"{url}/queue", timeout_seconds=TIMEOUT_SECONDS)
    except PortalError as error:
        raise QueueUnavailable(str(error)) from None
    if status != 200:
        raise QueueUnavailable(f"{url}/queue: HTTP {status}")
    return document


def live_queue() -> LiveQueue | None:
    """The scheduler's queue now; None when ``GPUWARDEN_SCHEDULER_URL`` is unset; QueueUnavailable
    (one line) when it does not answer with a queue."""
    url = scheduler_url()
    if url is None:
        return None
    try:
        return parse(_answer(url), url)
    except ValueError as error:
        raise QueueUnavailable(str(error)) from None


def unset_line() -> str:
    return (f"No live queue: `{SCHEDULER_URL_ENV}` is not set. Point it at the scheduler's HTTP port "
            "(`gpuwarden scheduler run`, helm value `scheduling.enabled`; `gpuwarden demo` sets it).")


def unavailable_line(error: QueueUnavailable) -> str:
    return f"The scheduler's live queue could not be read: {error}. Check `{SCHEDULER_URL_ENV}` and the scheduler."


def require() -> LiveQueue:
    """The live queue, or the page stops with one line saying why (unset, or no answer)."""
    try:
        queue = live_queue()
    except QueueUnavailable as error:
        _stop(st.error, unavailable_line(error), ":material/error:")
    if queue is None:
        _stop(st.info, unset_line(), ":material/info:")
    return queue


def _stop(draw: Any, line: str, icon: str) -> NoReturn:
    draw(line, icon=icon)
    st.stop()
