"""``gpuwarden queue``: the live queue, read from the running scheduler's ``/queue``.

    gpuwarden queue [--scheduler-url URL] [--namespace N] [--format table|json|csv|markdown] [--wide]

Waiting workloads in queue order, each with its position, priority, shape, how long it has
waited, an estimated start (UTC; empty where nothing says when GPUs free up) and why it waits;
the table ends with each team's guarantee, allocation and waiting work. CSV has every field. ``--format json`` prints the
scheduler's document as served. The URL defaults to ``$GPUWARDEN_SCHEDULER_URL``, else
http://127.0.0.1:8083 (``kubectl port-forward svc/gpuwarden-scheduler 8083`` reaches a cluster's).
"""

from __future__ import annotations

import argparse
import math
import json
import os
import urllib.error
import urllib.parse
import urllib.request

from gpuwarden.fleet.errors import UserError

from .args import number, plain
from .output import add_output_options, emit, render_rows

SCHEDULER_URL_ENV = "GPUWARDEN_SCHEDULER_URL"
DEFAULT_URL = "http://127.0.0.1:8083"
COLUMNS = ("position", "workload", "team", "priority_class", "shape", "gpus", "state", "waiting", "estimated_start",
           "reason")
TABLE_COLUMNS = ("position", "workload", "priority", "shape", "state", "waiting", "start", "reason")  # fits 120
TEAM_COLUMNS = ("team", "guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "borrowed_gpus", "lent_gpus",
                "pending_workloads", "pending_gpus")


class SchedulerUnreachable(UserError, RuntimeError):
    pass


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("queue", help="the live queue of the running scheduler",
                                   description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheduler-url", default=os.environ.get(SCHEDULER_URL_ENV) or DEFAULT_URL,
                        help=f"the scheduler's base URL (default ${SCHEDULER_URL_ENV} or {DEFAULT_URL})")
    parser.add_argument("--namespace", help="only this namespace's workloads")
    parser.add_argument("--timeout", type=number(float, 0.1, 3600), default=10.0,
                        help="seconds to wait for the whole answer, 0.1..3600 (default 10)")
    add_output_options(parser)
    parser.set_defaults(run=run)


def fetch_queue(url: str, namespace: str | None = None, timeout_seconds: float = 10.0) -> dict:
    """The scheduler's queue document; SchedulerUnreachable (one line) when it cannot be read, the
    whole request within ``timeout_seconds``."""
    from gpuwarden.portal.submit import PortalError
    from gpuwarden.portal.submitters import http_json

    query = "?" + urllib.parse.urlencode({"namespace": namespace}) if namespace else ""
    target = url.rstrip("/") + "/queue" + query
    try:
        status, document = http_json(target, timeout_seconds=timeout_seconds)
    except PortalError as error:
        raise SchedulerUnreachable(f"cannot read the queue: {error}; is 'gpuwarden scheduler run' (or the demo) "
                                   f"serving there? Set --scheduler-url or ${SCHEDULER_URL_ENV}") from None
    if status != 200:
        detail = document.get("error") if isinstance(document, dict) else None
        raise SchedulerUnreachable(f"{target}: HTTP {status}" + (f": {' '.join(str(detail).split())}" if detail else ""))
    problem = _shape_problem(document)
    if problem:
        raise SchedulerUnreachable(f"{target}: not a scheduler's queue ({problem})")
    return document


def _shape_problem(document: object) -> str | None:
    """What is wrong with the shape of a /queue answer (checked before any field is used), or None."""
    if not isinstance(document, dict) or not isinstance(document.get("workloads"), list):
        return "expected a JSON object with a 'workloads' list"
    for key in ("workloads", "teams"):
        items = document.get(key, [])
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            return f"expected '{key}' to be a list of JSON objects"
    for item in document["workloads"]:
        waiting = item.get("waiting_seconds")
        if waiting is not None and (isinstance(waiting, bool) or not isinstance(waiting, int | float)
                                    or not math.isfinite(waiting)):
            return f"workload {str(item.get('workload'))[:80]!r}: waiting_seconds {str(waiting)[:40]!r} is not a number"
    return None


def _waiting(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 1440}d{minutes // 60 % 24}h" if minutes >= 1440 else \
        f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def _short_time(iso: str | None) -> str:
    """An ISO time as ``MM-DD HH:MM`` UTC for the table; empty when unknown."""
    if not iso or not isinstance(iso, str):  # a wrong-shaped answer's value: nothing to show
        return ""
    from datetime import UTC, datetime

    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%m-%d %H:%M")
    except ValueError:
        return iso


def run(args: argparse.Namespace) -> int:
    document = fetch_queue(args.scheduler_url, args.namespace, args.timeout)
    if args.format == "json":
        emit(args, json.dumps(document, indent=2) + "\n")
        return 0
    workloads = document.get("workloads", [])
    if args.format == "csv":
        rows = [{**{c: w.get(c) for c in COLUMNS if c != "waiting"}, "waiting_seconds": w.get("waiting_seconds")}
                for w in workloads]
        emit(args, render_rows(rows, "csv"))
        return 0
    rows = [{"position": w.get("position"), "workload": w.get("workload"), "priority": w.get("priority_class"),
             "shape": w.get("shape"), "state": w.get("state"), "waiting": _waiting(w.get("waiting_seconds") or 0.0),
             "start": _short_time(w.get("estimated_start")), "reason": w.get("reason")} for w in workloads]
    heading = (f"queue at {document.get('taken_at')} (policy {document.get('policy')}, round {document.get('round')}): "
               f"{len(workloads)} waiting" + (f" in {args.namespace}" if args.namespace else "") + "\n")
    refused = any(t.get("error") for t in document.get("teams", []))  # a quota annotation that cannot be read
    teams = [{**{c: t.get(c) for c in TEAM_COLUMNS}, **({"error": t.get("error") or ""} if refused else {})}
             for t in document.get("teams", [])]
    text = heading + render_rows(rows, args.format, args.wide) + "\nteams\n" + render_rows(teams, args.format, args.wide)
    ignored = [{"pod": p.get("pod"), "reason": p.get("reason")} for p in document.get("ignored_pods") or ()
               if isinstance(p, dict)]
    if ignored:  # gated by hand outside the queue: gpuwarden leaves them alone
        text += "\nignored pods\n" + render_rows(ignored, args.format, args.wide)
    emit(args, text)
    return 0
