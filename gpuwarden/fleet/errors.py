"""The one base class of every error a user can cause and fix.

A user error is a flag, a config key, an environment variable, a file or a store the user named
that the program cannot use: the message names the value and what is allowed, and the CLI prints
it on one line and exits 2, with no traceback. Anything else that escapes a command is a bug
(exit 1). Each room's error subclasses :class:`UserError` (and keeps its old base, ``ValueError``
or ``RuntimeError``, so code that caught it by that base still does).

It lives in ``fleet``, the bottom room, so every room (the exporter included) can subclass it
without importing any other room; the CLI catches this one class instead of looking up names.
"""

from __future__ import annotations


class UserError(Exception):
    """An error the user caused and can fix; its message says which value and what is allowed."""
