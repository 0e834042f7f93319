"""Integer codes of the idle taxonomy's states and of who holds a GPU, as the classifier and the
ledger carry them in numpy arrays (:mod:`.params` documents what each state means)."""

from __future__ import annotations

from .params import STATE_CODES, STATES

UNALLOCATED = STATE_CODES["unallocated"]
IDLE_UNATTRIBUTED = STATE_CODES["idle_unattributed"]
ALLOCATED_IDLE = STATE_CODES["allocated_idle"]
HOARDED = STATE_CODES["hoarded"]
FAKE_BUSY = STATE_CODES["fake_busy"]
STARVED = STATE_CODES["starved"]
UNDERUTILIZED = STATE_CODES["underutilized"]
BUSY = STATE_CODES["busy"]
UNMEASURED = STATE_CODES["unmeasured"]
N_STATES = len(STATES)

# Holder codes: >= 0 a pod; NO_POD: known to be unallocated; UNATTRIBUTED: nobody could know.
NO_POD = -1
UNATTRIBUTED = -2

NS_PER_SECOND = 1_000_000_000
DEFAULT_STEP_NS = 60 * NS_PER_SECOND  # the embedded store's resolution; used when no interval can be measured
