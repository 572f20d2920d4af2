"""The one rule for JSON that nothing vouches for: request bodies of the engine's API and of
the Jupyter server extension, and the manifests of imported files.

Refused, each with a message that says what is wrong: a document larger than its limit (413),
text that is not JSON (invalid UTF-8 included), ``NaN``/``Infinity`` (no JSON number), a key
given twice in one object (the message names it: which of the two would win is a parser's
accident), and arrays and objects nested deeper than the limit (400). Python's parser
recurses, so very deep input is caught as the ``RecursionError`` it raises; the depth is then
checked without recursion.

Like :mod:`sandfork.protocol`, this module imports nothing of Sandfork's: the engine and its
clients (the server extension) both use it.
"""

from __future__ import annotations

import json
from typing import Any

MAX_JSON_DEPTH = 32
"""The engine's default nesting limit (``EngineConfig.max_json_depth``)."""


class JsonRefused(ValueError):
    """A document the rule refuses; ``status`` is the HTTP answer (400, or 413 for size)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class DuplicateKey(ValueError):
    """One object of the document has ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key[:100]!r} appears twice in one object")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A ``json.loads`` ``object_pairs_hook`` that refuses a key given twice in one object."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(key)
        found[key] = value
    return found


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse(
    raw: bytes | str,
    what: str = "the request body",
    max_depth: int = MAX_JSON_DEPTH,
    max_bytes: int | None = None,
) -> Any:
    """The JSON value of ``raw``, or a :class:`JsonRefused` whose message starts with
    ``what`` (the document's name for the user)."""
    _check_size(raw, what, max_bytes)
    try:
        value = json.loads(raw, parse_constant=_no_constant, object_pairs_hook=unique_keys)
    except RecursionError:
        raise JsonRefused(f"{what} nests deeper than {max_depth} levels") from None
    except DuplicateKey as e:
        raise JsonRefused(f"{what} is refused: {e}") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError among them
        raise JsonRefused(f"{what} is not valid JSON: {e}") from None
    check_depth(value, max_depth, what)
    return value


def parse_object(
    raw: bytes | str,
    what: str = "the request body",
    max_depth: int = MAX_JSON_DEPTH,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """:func:`parse` for a body that must be one JSON object; an empty body is ``{}``."""
    _check_size(raw, what, max_bytes)
    if not raw.strip():
        return {}
    value = parse(raw, what, max_depth)
    if not isinstance(value, dict):
        raise JsonRefused(f"{what} must be a JSON object")
    return value


def _check_size(raw: bytes | str, what: str, max_bytes: int | None) -> None:
    if max_bytes is not None and len(raw) > max_bytes:
        raise JsonRefused(f"{what} is larger than its limit of {max_bytes} bytes", 413)


def check_depth(value: Any, limit: int, what: str = "the request body") -> None:
    """A :class:`JsonRefused` when arrays and objects in ``value`` nest deeper than ``limit``
    (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        if depth > limit:
            raise JsonRefused(f"{what} nests deeper than {limit} levels")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)
