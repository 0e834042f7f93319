"""A small real HTTP server speaking the scheduler's queue contract (``GET /queue``, ``POST /submit``,
see /work/prompts/contract21.md "Live queue JSON"), for the portal and Queue page tests.

It is a stand-in for the scheduler's own server (``gpuwarden.scheduler.queue_server``), which is
wired to these pages at integration; it serves contract-shaped JSON the test writes, and records
what was posted. ``submit`` decides the answer to a POST (default: accept as ``ns/name-1``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TAKEN_AT = "2026-12-01T12:00:00+00:00"


def team(name: str, guaranteed: float, burst: float, allocated: float, pending: int = 0, pending_gpus: float = 0.0,
         borrowed: float = 0.0, lent: float = 0.0) -> dict[str, Any]:
    return {"team": name, "guaranteed_gpus": guaranteed, "burst_limit_gpus": burst, "allocated_gpus": allocated,
            "borrowed_gpus": borrowed, "lent_gpus": lent, "pending_workloads": pending, "pending_gpus": pending_gpus}


def waiting(position: int, namespace: str, name: str, team_name: str, gpus: float, reason: str,
            priority_class: str = "normal", state: str = "pending", estimated_start: str | None = None,
            requested_by: str = "", shape: str = "") -> dict[str, Any]:
    return {"position": position, "workload": f"{namespace}/{name}", "namespace": namespace, "name": name,
            "team": team_name, "priority_class": priority_class, "gpus": gpus, "shape": shape or f"{gpus:g} GPUs",
            "state": state, "waiting_seconds": 600.0 * position, "reason": reason, "estimated_start": estimated_start,
            "requested_by": requested_by}


def queue(teams: list[dict], workloads: list[dict], round_number: int = 42) -> dict[str, Any]:
    return {"taken_at": TAKEN_AT, "policy": "gpuwarden", "round": round_number, "teams": teams, "workloads": workloads}


@dataclass
class QueueServerStandIn:
    document: dict[str, Any]
    submit: Callable[[dict[str, Any], str], tuple[int, dict[str, Any]]] | None = None
    posted: list[dict[str, Any]] = field(default_factory=list)
    gets: int = 0
    url: str = ""

    def start(self) -> QueueServerStandIn:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/queue":
                    return self._answer(404, {"error": "not found"})
                stand_in.gets += 1
                return self._answer(200, stand_in.document)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path != "/submit":
                    return self._answer(404, {"error": "not found"})
                stand_in.posted.append(body)
                request, identity = body.get("request") or {}, body.get("identity") or ""
                if stand_in.submit is not None:
                    return self._answer(*stand_in.submit(request, identity))
                key = f"{request.get('team')}/{request.get('name')}-1"
                return self._answer(201, {"workload": key, "message": f"{key} queued"})

        self._server, self.url = serve_in_thread(Handler)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve_in_thread(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    """A threaded HTTP server on a free local port, serving in a daemon thread, and its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
