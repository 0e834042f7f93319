"""Start the dashboard as a child process (``streamlit run`` on :mod:`gpuwarden.dashboards.app`).

``launch_dashboard`` never opens a browser: Streamlit runs headless and the caller (the CLI)
decides whether to open :func:`dashboard_url`. The store is handed over in the
``GPUWARDEN_STORE`` environment variable of the child (a dashboard over Prometheus instead is
started with ``GPUWARDEN_SOURCE=prometheus`` in ``env``: see :mod:`gpuwarden.dashboards.data`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import STORE_ENV

APP_PATH = Path(__file__).resolve().parent / "app.py"


def dashboard_command(port: int = 8501, host: str = "127.0.0.1", extra_args: Sequence[str] = ()) -> list[str]:
    """The ``streamlit run`` command line for the dashboard (headless, no usage statistics)."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP_PATH),
        "--server.headless", "true",
        "--server.port", str(int(port)),
        "--server.address", host,
        "--browser.gatherUsageStats", "false",
        *extra_args,
    ]


def launch_dashboard(
    store_path: str | os.PathLike[str],
    port: int = 8501,
    host: str = "127.0.0.1",
    *,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    local_approver: str | None = None,
    **popen_kwargs: Any,
) -> subprocess.Popen[bytes]:
    """Start Streamlit serving the dashboard over the store at ``store_path``; return the process.

    ``env`` replaces the inherited environment (``GPUWARDEN_STORE`` is always set on top);
    ``extra_args`` are appended to the command line (other ``--server.*`` options);
    ``local_approver`` names a local user who may approve actions and edit team priorities without
    signing in (``GPUWARDEN_DEMO_APPROVER``: for a dashboard on a laptop, as ``gpuwarden demo``);
    ``popen_kwargs`` go to :class:`subprocess.Popen` (e.g. ``stdout=subprocess.DEVNULL``).
    The caller owns the process: ``terminate()`` and ``wait()`` it.
    """
    child_env = dict(os.environ if env is None else env)
    child_env[STORE_ENV] = str(Path(store_path).resolve())
    if local_approver:
        child_env["GPUWARDEN_DEMO_APPROVER"] = local_approver
    return subprocess.Popen(dashboard_command(port, host, extra_args), env=child_env, **popen_kwargs)


def dashboard_url(host: str = "127.0.0.1", port: int = 8501) -> str:
    """The URL to open for a dashboard listening on ``host:port`` (a wildcard address maps to
    localhost; IPv6 literals get brackets)."""
    if host in ("", "0.0.0.0") or host == "::":
        host = "localhost"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"
