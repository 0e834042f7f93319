"""What an API call raises: :class:`KubeFailure`, one subclass per kind a caller acts on differently.

Every failure keeps ``status`` (the HTTP status; None when no answer came), ``message`` (one line
for a person) and ``temporary`` (a retry may help), so ``except KubeFailure`` and
``failure.status == 404`` keep working; the kinds let a caller say what it means instead:

- permanent (:class:`PermanentFailure`, retrying the same request cannot help): :class:`NotFound` 404
  (already gone), :class:`Forbidden` 403 (RBAC), :class:`Unauthorized` 401 (credentials),
  :class:`Invalid` 422 (the object was refused), and any other 4xx as a plain ``PermanentFailure``;
- temporary (:class:`TemporaryFailure`, like kopf's TemporaryError): :class:`Conflict` 409 (changed
  meanwhile or already exists: re-read, then retry), :class:`TooManyRequests` 429 (throttled, or a
  PodDisruptionBudget), :class:`ServerFailure` 5xx, :class:`Unreachable` (no HTTP answer: refused,
  reset, timed out) and :class:`UnexpectedAnswer` (an answer gpuwarden cannot read).

``retry_after`` is the API server's ``Retry-After`` in seconds, when it sent one. The translation
from the client's exceptions is :func:`gpuwarden.kube.api.translate`, the only one.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar


class KubeFailure(Exception):
    """A failed API call. Raised as one of the subclasses below; constructed directly only where no
    single kind fits (a plan step refused for a reason of its own)."""

    def __init__(self, status: int | None, message: str, temporary: bool, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status  # HTTP status; None for a timeout, a refused connection or an unreadable answer
        self.message = message
        self.temporary = temporary
        self.retry_after = retry_after  # seconds the server asked us to wait (Retry-After), if it did

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, message={self.message!r}, temporary={self.temporary!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle keep the kind and every attribute
        return (_rebuilt, (type(self),), self.__dict__)

    @property
    def gone(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    def noted(self, note: str) -> KubeFailure:
        """The same failure (its kind, status and retry_after) with ``note`` after its message."""
        again = copy.copy(self)
        again.message = f"{self.message} ({note})"
        again.args = (again.message,)
        return again


def _rebuilt(kind: type[KubeFailure]) -> KubeFailure:
    return kind.__new__(kind)


class _Kind(KubeFailure):
    """A kind: its status and whether it is temporary are the class's; the status may be given
    (a 502 is a ServerFailure too)."""

    STATUS: ClassVar[int | None] = None
    TEMPORARY: ClassVar[bool] = False

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(self.STATUS if status is None else status, message, self.TEMPORARY, retry_after=retry_after)


class PermanentFailure(_Kind):
    """Retrying the same request cannot help: the caller records it and moves on."""


class TemporaryFailure(_Kind):
    """A later try may succeed (kopf's TemporaryError): the caller retries, now or next round."""

    TEMPORARY = True


class NotFound(PermanentFailure):
    """404: the object (or, for a whole resource, its CRD) is not there: often "already gone"."""

    STATUS = 404


class Forbidden(PermanentFailure):
    """403: the service account lacks the verb on the resource (RBAC), or an admission plugin refused."""

    STATUS = 403


class Unauthorized(PermanentFailure):
    """401: the credentials were refused (an expired token, a wrong kubeconfig user)."""

    STATUS = 401


class Invalid(PermanentFailure):
    """422: the API server refused the object or the change (validation, an immutable field)."""

    STATUS = 422


class Conflict(TemporaryFailure):
    """409: the object changed since it was read (a stale resourceVersion) or already exists:
    re-read and try again; :meth:`KubeApi.call` never retries it blindly."""

    STATUS = 409


class TooManyRequests(TemporaryFailure):
    """429: throttled by the API server (or an eviction a PodDisruptionBudget blocks)."""

    STATUS = 429


class ServerFailure(TemporaryFailure):
    """5xx: the API server (or what is in front of it) failed; ``status`` says which."""

    STATUS = 500


class Unreachable(TemporaryFailure):
    """No HTTP answer: connection refused or reset, a TLS failure, a timeout."""


class UnexpectedAnswer(TemporaryFailure):
    """An answer gpuwarden cannot read (not JSON, the wrong shape): nothing is built on it."""


def failure_for_status(status: int, message: str, retry_after: float | None = None) -> KubeFailure:
    """The kind of failure an HTTP status is."""
    kind = _BY_STATUS.get(status)
    if kind is not None:
        return kind(message, retry_after=retry_after)
    if status >= 500:
        return ServerFailure(message, status=status, retry_after=retry_after)
    return PermanentFailure(message, status=status, retry_after=retry_after)


_BY_STATUS: dict[int, type[_Kind]] = {kind.STATUS: kind for kind in (NotFound, Forbidden, Unauthorized, Invalid,
                                                                     Conflict, TooManyRequests)
                                      if kind.STATUS is not None}
