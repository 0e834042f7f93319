"""Registries of the named parts a queue policy is made of: name -> part, one registry per kind.

A policy names its parts (``QueuePolicy.order`` a queue order, ``preempt`` a victim choice,
``admission`` an admission check, ``placement.scorer`` a placement scorer); the engine looks each up
once, when a scheduler is made, and calls it. A new part is one ``register`` call, in a module of
its own: nothing else branches on its name.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Generic, TypeVar

from .errors import SchedulingError

Part = TypeVar("Part")


class Registry(Collection[str], Generic[Part]):
    """Parts of one kind by name, in the order registered (the order an error lists them in)."""

    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind  # what the parts are, for errors: "queue order"
        self.key = key  # the policy field that names one, for errors: "order"
        self._parts: dict[str, Part] = {}

    def register(self, name: str, part: Part) -> Part:
        """Add ``part`` as ``name``; a name is registered once (a second part under it would change
        what every policy naming it decides, silently)."""
        if name in self._parts:
            raise ValueError(f"{self.kind} {name!r} is registered already")  # a bug, not a user error
        self._parts[name] = part
        return part

    def registers(self, name: str) -> Callable[[Part], Part]:
        """``register`` as a decorator."""
        return lambda part: self.register(name, part)

    def unregister(self, name: str) -> None:
        """Take ``name`` out again (a test's toy part)."""
        del self._parts[name]

    def __getitem__(self, name: str) -> Part:
        part = self._parts.get(name)
        if part is None:
            raise SchedulingError(f"{self.key}: {self.kind} {name!r} is not one of: {', '.join(self._parts)}")
        return part

    def __contains__(self, name: object) -> bool:
        return name in self._parts

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)
