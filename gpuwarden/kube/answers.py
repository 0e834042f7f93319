"""What an API server's answer must look like before gpuwarden uses it.

Valid JSON of the wrong shape (a list where an object belongs, an item without ``metadata.name``,
a ``spec`` that is a string) is an :class:`UnexpectedAnswer` (a temporary ``KubeFailure``) naming
the resource and the object, never a traceback and never half a snapshot: a round that cannot
read the cluster acts on nothing and is retried at the next one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .failure import UnexpectedAnswer


_READS = ("get", "list")


def _unexpected(verb: str, resource: str, what: str) -> UnexpectedAnswer:
    # a write's answer comes after the server acted: an unreadable one says nothing of whether it did
    outcome = "nothing was acted on" if verb in _READS else "the change may have been made"
    return UnexpectedAnswer(f"{verb} {resource}: the API server's answer {what}; {outcome}")


def parse_object(data: bytes | str, verb: str, resource: str) -> dict[str, Any]:
    """The answer's body as a JSON object (an empty body is ``{}``)."""
    if not data:
        return {}
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, ValueError) as error:
        raise _unexpected(verb, resource, f"is not JSON ({error})") from error
    if not isinstance(parsed, dict):
        raise _unexpected(verb, resource, f"is a JSON {type(parsed).__name__}, not an object")
    return parsed


def list_items(page: dict[str, Any], resource: str) -> list[dict[str, Any]]:
    """A list page's ``items``: each an object with a string ``metadata.name``."""
    items = page.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise _unexpected("list", resource, f"has items of type {type(items).__name__}, not a list")
    for position, item in enumerate(items):
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
            raise _unexpected("list", resource, f"has item {position} without an object's metadata.name")
    return items


def object_name(item: dict[str, Any]) -> str:
    metadata = item.get("metadata") or {}
    namespace, name = metadata.get("namespace"), metadata.get("name", "?")
    return f"{namespace}/{name}" if namespace else str(name)


@contextmanager
def reading(resource: str, item: dict[str, Any] | None = None) -> Iterator[None]:
    """Read one object (or, without ``item``, what was gathered from a list): a field of the wrong
    type inside it becomes an UnexpectedAnswer naming the object."""
    try:
        yield
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as error:
        where = f"{resource} {object_name(item)}" if item is not None else resource
        raise UnexpectedAnswer(f"{where}: the API server's answer has an unexpected shape "
                               f"({type(error).__name__}: {error}); nothing was acted on") from error
