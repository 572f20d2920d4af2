"""Checks of request fields: each wrong value is a 400 (or 413) with a message naming it.

Strings that reach the guest (commands, paths, environment) are refused when they hold a NUL
or a lone surrogate, which no process argument, file name or environment entry can carry.
"""

from __future__ import annotations

import math
import re
from typing import Any

from sandfork.engine.config import EngineConfig
from sandfork.engine.errors import BadRequest, TooLarge
from sandfork.protocol import ENGINE_METADATA_KEYS

MAX_PATH_CHARS = 4096
MAX_ENV_ENTRIES = 256
MAX_ENV_KEY_CHARS = 256
MAX_ENV_BYTES = 128 * 1024  # keys and values together, well below the kernel's ARG_MAX
MAX_TIMEOUT_S = 86400


def field(
    body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None
) -> Any:
    """``body[name]`` checked against ``kind``; a missing field gives ``default``."""
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise BadRequest(f"field {name!r} must be a number, not a boolean")
    if not isinstance(value, kind):
        expected = (
            kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        )
        raise BadRequest(f"field {name!r} must be of type {expected}")
    return value


def timeout_field(body: dict[str, Any], seconds: str, millis: str | None = None) -> float | None:
    """A positive timeout in seconds, given in seconds or (PandaStack's run) in milliseconds."""
    value = field(body, seconds, (int, float))
    if value is None and millis is not None:
        ms = field(body, millis, (int, float))
        value = None if ms is None else ms / 1000
    if value is not None and not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise BadRequest(f"timeout must be between 0 and {MAX_TIMEOUT_S} seconds, got {value}")
    return None if value is None else float(value)


def check_text(value: str, what: str, max_chars: int) -> str:
    """``value`` if it is at most ``max_chars`` long and has no NUL or lone surrogate."""
    if len(value) > max_chars:
        raise BadRequest(f"{what} is longer than {max_chars} characters")
    if "\x00" in value:
        raise BadRequest(f"{what} must not contain NUL characters")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise BadRequest(f"{what} is not valid Unicode (a lone surrogate)") from None
    return value


def text_field(
    body: dict[str, Any], name: str, max_chars: int, default: str | None = None
) -> str | None:
    """An optional string field, checked by :func:`check_text`."""
    value: str | None = field(body, name, str, default)
    return None if value is None else check_text(value, f"field {name!r}", max_chars)


def env_field(body: dict[str, Any]) -> dict[str, str]:
    """The optional ``env``: names (non-empty, no ``=``) to values, no NULs, bounded."""
    env: dict[str, Any] = field(body, "env", dict, {})
    if len(env) > MAX_ENV_ENTRIES:
        raise BadRequest(f"env has more than {MAX_ENV_ENTRIES} variables")
    size = 0
    for key, value in env.items():
        if not isinstance(value, str):
            raise BadRequest(f"env must map strings to strings ({key[:64]!r} is not a string)")
        check_text(key, "an env name", MAX_ENV_KEY_CHARS)
        if not key or "=" in key:
            raise BadRequest(f"env name {key[:64]!r} must be non-empty and contain no '='")
        check_text(value, f"env value of {key!r}", MAX_ENV_BYTES)
        size += len(key.encode()) + len(value.encode()) + 2
    if size > MAX_ENV_BYTES:
        raise TooLarge(f"env is larger than {MAX_ENV_BYTES} bytes in all")
    return env


def metadata_field(body: dict[str, Any], config: EngineConfig) -> dict[str, str]:
    """The optional ``metadata`` object: strings to strings, within the engine's limits,
    none of the keys the engine writes itself (:data:`~sandfork.protocol.ENGINE_METADATA_KEYS`)."""
    metadata: dict[str, Any] = field(body, "metadata", dict, {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise BadRequest("metadata must map strings to strings")
    if len(metadata) > config.max_metadata_keys:
        raise TooLarge(f"metadata has more than {config.max_metadata_keys} keys")
    total = 0
    for key, value in metadata.items():
        if not key:
            raise BadRequest("metadata keys must not be empty")
        if key in ENGINE_METADATA_KEYS:
            raise BadRequest(f"metadata key {key!r} is the engine's own (it records it itself)")
        check_text(key, "a metadata key", config.max_metadata_key_chars)
        check_text(value, f"metadata value of {key!r}", config.max_metadata_value_bytes)
        size = len(value.encode())
        if size > config.max_metadata_value_bytes:
            raise TooLarge(
                f"metadata value of {key!r} is larger than {config.max_metadata_value_bytes} bytes"
            )
        total += len(key.encode()) + size
    if total > config.max_metadata_bytes:
        raise TooLarge(f"metadata is larger than {config.max_metadata_bytes} bytes in all")
    return metadata


def int_argument(text: str | None, name: str, minimum: int, maximum: int) -> int | None:
    """An optional integer query parameter within ``[minimum, maximum]``."""
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise BadRequest(f"query parameter {name!r} must be a non-negative integer")
    value = int(text)
    if not minimum <= value <= maximum:
        raise BadRequest(f"query parameter {name!r} must be between {minimum} and {maximum}")
    return value


_TEMPLATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def template_field(body: dict[str, Any], default: str) -> str:
    """The ``template`` to create from: a name, never a path (which would be read on the host)."""
    name: str = field(body, "template", str, default)
    if not _TEMPLATE_NAME.fullmatch(name) or name.endswith(".toml"):
        raise BadRequest(
            f"bad template name {name[:64]!r}: 1-128 letters, digits, '.', '_' and '-'"
        )
    return name
