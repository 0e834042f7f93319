"""The admission webhook's serving certificate: checked at start, reloaded when it changes.

:func:`load_context` reads ``tls.crt`` and ``tls.key`` from a folder (the mounted Secret that
cert-manager or ``certs.py`` keeps) and builds the TLS context, or raises
:class:`WebhookCertificateError`, one line naming the file and what is wrong with it: missing, not a
regular file (a FIFO would block the read for ever), larger than :data:`MAX_CERT_FILE_BYTES`, not
PEM, or a key that does not match the certificate. The webhook refuses to start on it (exit 2 at
the CLI): a server that refuses every handshake would look up and serve nothing.

:class:`ReloadingTLS` holds the context the server wraps each connection with, and rebuilds it when
the files change (a rotation needs no restart); a pair that stops loading mid-life (absent while a
Secret is rewritten) keeps the previous context, with a warning.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from gpuwarden.fleet.errors import UserError
from gpuwarden.fleet.inputs import checked_input

log = logging.getLogger("gpuwarden.kube.webhook")

CERT_FILE, KEY_FILE = "tls.crt", "tls.key"  # the keys of a kubernetes.io/tls Secret, mounted as files
MAX_CERT_FILE_BYTES = 1024 * 1024  # a chain of a few certificates is a few KB


class WebhookCertificateError(UserError, ValueError):
    """The webhook's certificate folder holds no usable pair (the webhook does not start)."""


def _read(path: Path, what: str) -> bytes:
    checked_input(path, what, MAX_CERT_FILE_BYTES, raising=WebhookCertificateError)
    try:
        return path.read_bytes()
    except OSError as error:  # unreadable: permissions, a file gone meanwhile
        raise WebhookCertificateError(f"{what} {path}: cannot read ({error.strerror or error})") from None


def load_context(cert_dir: str | Path) -> ssl.SSLContext:
    """A server TLS context for the pair in ``cert_dir``; WebhookCertificateError (one line) if none."""
    cert_path, key_path = Path(cert_dir) / CERT_FILE, Path(cert_dir) / KEY_FILE
    cert_pem = _read(cert_path, "the webhook certificate")
    key_pem = _read(key_path, "the webhook key")
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise WebhookCertificateError(f"the webhook certificate {cert_path}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, None)
    except (ValueError, TypeError, UnsupportedAlgorithm):  # TypeError: a key that needs a password
        raise WebhookCertificateError(f"the webhook key {key_path}: not an unencrypted PEM private key") from None
    if chain[0].public_key() != key.public_key():
        raise WebhookCertificateError(f"the webhook key {key_path} does not match the certificate {cert_path}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as error:  # replaced between the check and the load, or a key OpenSSL refuses
        raise WebhookCertificateError(f"the webhook certificate {cert_path}: not loadable ({error})") from None
    return context


class ReloadingTLS:
    """An SSL context for the certificate in ``cert_dir``, rebuilt when its files change.

    Secret volumes change by an atomic symlink swap, so the (inode, size, mtime) of the files the
    links resolve to changes; the check is a stat at most every ``check_seconds``.
    """

    def __init__(self, cert_dir: str | Path, check_seconds: float = 5.0) -> None:
        self.cert_dir = Path(cert_dir)
        self.cert_path = self.cert_dir / CERT_FILE
        self.key_path = self.cert_dir / KEY_FILE
        self.check_seconds = check_seconds
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._stamp: tuple[tuple[int, int, int], ...] | None = None
        self._checked_at = float("-inf")
        self.loads = 0  # contexts built (tests and logs read it)

    def _files_stamp(self) -> tuple[tuple[int, int, int], ...]:
        stats = [os.stat(path) for path in (self.cert_path, self.key_path)]
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def _build(self) -> ssl.SSLContext:
        try:
            stamp: tuple[tuple[int, int, int], ...] | None = self._files_stamp()  # before the read: a
        except FileNotFoundError:  # change meanwhile is seen at the next check; load_context names the file
            stamp = None
        self._context, self._stamp = load_context(self.cert_dir), stamp
        self.loads += 1
        log.info("webhook serving certificate loaded from %s", self.cert_path)
        return self._context

    def load(self) -> ssl.SSLContext:
        """The context from the files as they are now; WebhookCertificateError (one line) if they are
        no usable pair. The server calls it once, before it listens."""
        with self._lock:
            self._checked_at = time.monotonic()
            return self._build()

    def context(self) -> ssl.SSLContext | None:
        """The current context; None while no certificate can be read (the handshake is refused)."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked_at < self.check_seconds:  # also bounds the warnings while there is none
                return self._context
            self._checked_at = now
            try:
                if self._files_stamp() != self._stamp:
                    self._build()
            except (OSError, WebhookCertificateError) as error:  # absent while the Secret is rewritten
                log.warning("webhook certificate %s not loadable (%s); keeping the previous one", self.cert_path, error)
            return self._context
