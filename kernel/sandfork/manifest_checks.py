"""Checks of documents nothing vouches for: the manifest that heads an exported file (a
snapshot's or a template's) and the guest agent's replies (:mod:`sandfork.engine.replies`).
JSON by :mod:`sandfork.strict_json`'s rule (no key twice, no ``NaN``, bounded nesting), fields
of known names only, bounded integers, strings of a pattern or a length, booleans, and member
entries (size and SHA-256).

Each check raises the caller's own error, made by ``fail`` from a message that says where the
document is wrong, so the snapshot and template imports word their refusals alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

from sandfork import strict_json

Fail = Callable[[str], Exception]
SHA256 = re.compile(r"[0-9a-f]{64}")


def document(data: bytes, fail: Fail) -> Any:
    """The JSON value of the manifest ``data``, parsed by the rule of request bodies
    (:func:`sandfork.strict_json.parse`); a refusal is raised as ``fail``'s error."""
    try:
        return strict_json.parse(data, "it")
    except strict_json.JsonRefused as e:
        raise fail(e.message) from None


def fields(
    value: object,
    where: str,
    required: Collection[str],
    fail: Fail,
    optional: Collection[str] = frozenset(),
    *,
    others: bool = False,
) -> dict[str, Any]:
    """``value`` if it is an object with every ``required`` field and no unknown one
    (``others``: unknown ones are let be, for the caller to ignore)."""
    if not isinstance(value, dict):
        raise fail(f"{where} must be an object")
    unknown = sorted(set(value) - set(required) - set(optional))
    if unknown and not others:
        raise fail(f"unknown field {str(unknown[0])[:100]!r} in {where}")
    missing = sorted(set(required) - set(value))
    if missing:
        raise fail(f"{where} lacks the field {missing[0]!r}")
    return value


def integer(value: object, where: str, lo: int, hi: int, fail: Fail) -> int:
    """``value`` if it is an integer (not a boolean) from ``lo`` to ``hi``."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise fail(f"{where} must be an integer from {lo} to {hi}")
    return value


def number(value: object, where: str, lo: float, hi: float, fail: Fail) -> float:
    """``value`` if it is a number (not a boolean, not NaN) from ``lo`` to ``hi``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise fail(f"{where} must be a number from {lo:g} to {hi:g}")
    return value


def flag(value: object, where: str, fail: Fail) -> bool:
    """``value`` if it is a boolean."""
    if not isinstance(value, bool):
        raise fail(f"{where} must be true or false")
    return value


def text(value: object, where: str, most: int, fail: Fail) -> str:
    """``value`` if it is a string of at most ``most`` characters."""
    if not isinstance(value, str) or len(value) > most:
        raise fail(f"{where} must be text of at most {most} characters")
    return value


def matching(value: object, where: str, pattern: re.Pattern[str], fail: Fail) -> str:
    """``value`` if it is a string that ``pattern`` matches whole."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise fail(f"{where} is not a valid value ({pattern.pattern})")
    return value


def member(value: object, name: str, smallest: int, cap: int, fail: Fail) -> tuple[int, str]:
    """The listed size (``smallest`` to ``cap``) and SHA-256 of the member ``name``."""
    where = f"members[{name!r}]"
    entry = fields(value, where, {"size", "sha256"}, fail)
    size = integer(entry["size"], f"{where}.size", smallest, cap, fail)
    return size, matching(entry["sha256"], f"{where}.sha256", SHA256, fail)
