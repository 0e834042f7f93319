"""Child processes and local ports, as the CLI, the benches and the tests start and stop them."""

from __future__ import annotations

import socket
import subprocess


def stop_process(process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_seconds: float = 10.0) -> int:
    """Ask a child to end (SIGTERM), kill it after ``timeout_seconds``; returns its exit status.

    Always waits for the child, so none is left a zombie, and is a no-op on one that has ended."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's pick); a child is then started on it."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
