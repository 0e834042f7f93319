"""Readiness polling for the server processes benchmarks start (Prometheus, exporters)."""

from __future__ import annotations

import subprocess
import time
import urllib.request


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 60.0, interval: float = 0.2) -> None:
    """Poll ``url`` until it answers 200; fail with the process' stderr if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            if process.poll() is not None:
                detail = process.stderr.read().decode(errors="replace") if process.stderr else ""
                raise RuntimeError(f"{url}: the server exited with {process.returncode}: {detail[-2000:]}") from None
            time.sleep(interval)
    raise RuntimeError(f"{url} did not answer within {timeout:g} s")
