"""CEL selectors of DeviceClasses and claim requests as gpuwarden reads them (``resource.k8s.io/v1``), and
the field checks every DRA object's parsing shares (:mod:`.dra_objects`).

gpuwarden reads conjunctions (``&&``) of terms it can evaluate on a published device: the driver,
an attribute's equality or inequality (``device.attributes['gpu.nvidia.com'].productName == 'NVIDIA
H100 80GB HBM3'``), and the memory a device publishes compared with a quantity
(``device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0``, ``.isGreaterThan``,
``.isLessThan``). Anything else (``||``, ``!``, ``?:``, another function, an attribute gpuwarden does
not read) is kept as text (:meth:`Match.unevaluable`) and said, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kubernetes.utils import parse_quantity

_LITERAL = r"""(?:'[^']*'|"[^"]*"|-?\d+|true|false)"""
_DRIVER_TERM = re.compile(rf"^device\.driver\s*(==|!=)\s*({_LITERAL})$")
_ATTRIBUTE_TERM = re.compile(
    rf"""^device\.attributes\[\s*(['"])([^'"]+)\1\s*\]\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*(['"])([^'"]+)\4\s*\])"""
    rf"""\s*(==|!=)\s*({_LITERAL})$""")
# device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0, or .isGreaterThan / .isLessThan
_MEMORY_TERM = re.compile(
    r"""^device\.capacity\[\s*(['"])([^'"]+)\1\s*\]\s*\.\s*memory\s*\.\s*(compareTo|isGreaterThan|isLessThan)\s*"""
    r"""\(\s*quantity\(\s*(['"])([^'"]+)\4\s*\)\s*\)\s*(?:(==|!=|>=|<=|>|<)\s*(-?\d+))?$""")
_WHOLE_UNREAD = re.compile(r"\|\||\?|!(?!=)")  # an expression with ||, ?: or ! is kept whole, unread
# What a selector may test that gpuwarden evaluates: the attributes it reads of a device, and its memory
EVALUATED = {"type": "kind", "productName": "product", "profile": "profile", "uuid": "uuid", "parentUUID": "parent_uuid"}
MEMORY = "memory"


def _dict(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{what} is a {type(value).__name__}, not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{what} is a {type(value).__name__}, not a list")
    return value


def _text(value: Any, what: str, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise TypeError(f"{what} is {value!r}, not a non-empty string")
    return value


@dataclass(frozen=True)
class Match:
    """What a selector list asks, as far as gpuwarden reads CEL: the driver, attribute equalities
    (``type``, ``profile``, ``productName``, ...) and the terms it could not read."""

    driver: str | None = None
    equals: tuple[tuple[str, str | int | bool], ...] = ()
    unread: tuple[str, ...] = ()
    # other comparisons read: (attribute, "!=", value), (MEMORY, operator, bytes) for a capacity test
    compares: tuple[tuple[str, str, str | int | bool], ...] = ()

    def value(self, attribute: str) -> str | int | bool | None:
        return next((v for k, v in self.equals if k == attribute), None)

    def joined(self, other: Match) -> Match:
        return Match(self.driver or other.driver, self.equals + other.equals, self.unread + other.unread,
                     self.compares + other.compares)

    @property
    def selective(self) -> bool:
        """Whether it tests more than the driver, the kind and the MIG profile (a product, memory, a UUID)."""
        return any(k not in ("type", "profile") for k, _ in self.equals) or bool(self.compares)

    def unevaluable(self) -> tuple[str, ...]:
        """The terms gpuwarden cannot evaluate on a device: unread CEL, or a test of an attribute it does not read."""
        out = list(self.unread)
        out += [f"{k} == {v!r}" for k, v in self.equals if k not in EVALUATED]
        out += [f"{k} {op} {v!r}" for k, op, v in self.compares if k not in EVALUATED and k != MEMORY]
        return tuple(out)

    def said(self) -> str:
        """Its tests as a person reads them (for a queue reason)."""
        terms = [f"{k} == {v!r}" for k, v in self.equals if k not in ("type", "profile")]
        terms += [f"memory {op} {_gib(v)}" if k == MEMORY else f"{k} {op} {v!r}" for k, op, v in self.compares]
        return " && ".join(terms) or "its kind"


def _gib(value: object) -> str:
    return f"{int(value) / (1 << 30):g}Gi" if isinstance(value, int) else str(value)


def _compare(have: int, op: str, bound: int) -> bool:
    return {"==": have == bound, "!=": have != bound, ">=": have >= bound, "<=": have <= bound, ">": have > bound,
            "<": have < bound}[op]


def _literal(text: str) -> str | int | bool:
    if text[:1] in "'\"":
        return text[1:-1]
    return text == "true" if text in ("true", "false") else int(text)


def read_selectors(selectors: Any, what: str) -> Match:
    """``selectors[].cel.expression`` as a :class:`Match`: each ``&&`` term gpuwarden can read is kept,
    every other term (or a whole expression with ``||``, ``!`` or parentheses) is listed unread."""
    match = Match()
    for position, raw in enumerate(_list(selectors, what)):
        cel = _dict(_dict(raw, f"{what}[{position}]").get("cel"), f"{what}[{position}].cel")
        expression = str(_text(cel.get("expression"), f"{what}[{position}].cel.expression"))
        if _WHOLE_UNREAD.search(expression):
            match = match.joined(Match(unread=(expression,)))
            continue
        for term in (t.strip() for t in expression.split("&&")):
            match = match.joined(_term(term))
    return match


def _term(term: str) -> Match:
    """One ``&&`` term: the driver, an attribute's (in)equality, a memory comparison, else unread."""
    driver, attribute, memory = _DRIVER_TERM.match(term), _ATTRIBUTE_TERM.match(term), _MEMORY_TERM.match(term)
    if driver and driver.group(1) == "==":
        return Match(driver=str(_literal(driver.group(2))))
    if attribute:
        name, value = attribute.group(3) or attribute.group(5), _literal(attribute.group(7))
        return Match(equals=((name, value),)) if attribute.group(6) == "==" else Match(compares=((name, "!=", value),))
    if memory:
        try:
            bound = int(parse_quantity(memory.group(5)))
        except (ValueError, TypeError, ArithmeticError):
            return Match(unread=(term,))
        method, op, number = memory.group(3), memory.group(6), memory.group(7)
        if method == "isGreaterThan" and op is None:
            return Match(compares=((MEMORY, ">", bound),))
        if method == "isLessThan" and op is None:
            return Match(compares=((MEMORY, "<", bound),))
        if method == "compareTo" and op is not None and number == "0":  # compareTo is -1, 0 or 1: against 0 only
            return Match(compares=((MEMORY, op, bound),))
    return Match(unread=(term,))
