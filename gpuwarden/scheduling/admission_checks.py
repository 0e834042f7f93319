"""Admission checks: the registered parts that say whether a waiting job may start now, by its team's quota.

``ADMISSION_CHECKS[name]`` is a function ``(quotas, job) -> (Admission, reason)`` that a policy names
with ``QueuePolicy.admission`` (empty: ``quotas`` when the policy enforces quotas, else ``open``).
A job a check says NO to waits with the reason; BORROW marks a start on lent capacity (reclaimable).
"""

from __future__ import annotations

from collections.abc import Callable

from .parts import Registry
from .quotas import Admission, Quotas
from .state import Job

AdmissionCheck = Callable[[Quotas, Job], tuple[Admission, str]]


def open_admission(quotas: Quotas, job: Job) -> tuple[Admission, str]:
    """``open``: every job starts as if within a guarantee (quotas are not enforced)."""
    return Admission.NOMINAL, ""


def quota_admission(quotas: Quotas, job: Job) -> tuple[Admission, str]:
    """``quotas``: guarantees and burst limits (``Quotas.admit``)."""
    return quotas.admit(job)


ADMISSION_CHECKS: Registry[AdmissionCheck] = Registry("admission check", "admission")
ADMISSION_CHECKS.register("open", open_admission)
ADMISSION_CHECKS.register("quotas", quota_admission)
