"""Where the analytics engine used to live in one module; it is now split along its seams:

- :mod:`.state_codes`: the integer codes of states and holders;
- :mod:`.classifier`: numpy arrays of samples in, a state per sample out (pure);
- :mod:`.ledger`: :class:`Ledger` and :class:`LedgerBuilder` (instances, pricing, the sums);
- :mod:`.reader`: :func:`build_ledger`, reading a DataFrame, a samples source or rollups.

The names below stay importable from here.
"""

from .ledger import COLUMNS, HOLDER, IDENTITY, REQUIRED, Ledger, LedgerBuilder
from .reader import RAW_READ_SLOWDOWN, build_ledger

__all__ = ["COLUMNS", "HOLDER", "IDENTITY", "REQUIRED", "RAW_READ_SLOWDOWN", "Ledger", "LedgerBuilder", "build_ledger"]
