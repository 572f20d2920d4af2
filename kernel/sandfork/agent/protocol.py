"""Framing, argument checking and reply shapes of the agent protocol.

See docs/agent-protocol.md for the contract: newline-delimited JSON objects, one per line.
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
from typing import Any, TypeVar, cast

Frame = dict[str, Any]

T = TypeVar("T")
D = TypeVar("D")

ERROR_TYPES = frozenset(
    {
        "BadRequest",
        "NotFound",
        "IsADirectory",
        "NotADirectory",
        "Exists",
        "PermissionDenied",
        "Timeout",
        "TooLarge",
        "KernelDied",
        "Busy",
        "Internal",
    }
)

_OS_ERROR_TYPES = {
    errno.ENOENT: "NotFound",
    errno.EISDIR: "IsADirectory",
    errno.ENOTDIR: "NotADirectory",
    errno.EEXIST: "Exists",
    errno.EACCES: "PermissionDenied",
    errno.EPERM: "PermissionDenied",
    errno.EROFS: "PermissionDenied",
    errno.ETIMEDOUT: "Timeout",
    errno.EAGAIN: "Busy",
}


class AgentError(Exception):
    """A failed request, reported to the host as ``{"ok": false, "error": {...}}``."""

    def __init__(self, kind: str, message: str) -> None:
        assert kind in ERROR_TYPES, kind
        super().__init__(message)
        self.kind = kind
        self.message = message


def error_from_os(exc: OSError) -> AgentError:
    """Translate an OSError into the protocol error type that matches its errno."""
    kind = _OS_ERROR_TYPES.get(exc.errno or 0, "Internal")
    if kind == "Busy":  # fork or clone refused: the sandbox is at one of its limits
        return AgentError(
            kind, f"the sandbox is at its limit of processes or memory ({exc.strerror}): try again"
        )
    if exc.strerror and exc.filename is not None:
        message = f"{exc.strerror}: {exc.filename}"
    else:
        message = exc.strerror or str(exc)
    return AgentError(kind, message)


def encode(frame: Frame) -> bytes:
    """Serialize one frame as a UTF-8 JSON line terminated by a newline."""
    text = json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. decoded from "\ud800" escapes) are not valid UTF-8.
        data = json.dumps(frame, separators=(",", ":")).encode("ascii")
    return data + b"\n"


def decode(line: bytes) -> Frame | None:
    """Parse one line into a frame; return None for anything that is not a JSON object."""
    try:
        frame = json.loads(line)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None


def reply_ok(request_id: int, result: Frame) -> Frame:
    """The final success reply to a request."""
    return {"id": request_id, "ok": True, "result": result}


def reply_error(request_id: int, error: AgentError) -> Frame:
    """The final failure reply to a request."""
    return {"id": request_id, "ok": False, "error": {"type": error.kind, "message": error.message}}


def stream_event(request_id: int, name: str, data: str) -> Frame:
    """A ``stdout``/``stderr`` event sent before the final reply of a streaming request."""
    return {"id": request_id, "event": name, "data": data}


def b64encode(data: bytes) -> str:
    """Standard base64 text of ``data``."""
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str, name: str) -> bytes:
    """Decode the base64 argument ``name``, raising BadRequest if it is not valid base64."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AgentError("BadRequest", f"{name!r} is not valid base64: {exc}") from None


_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def _check(name: str, value: object, kind: type[T]) -> T:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return cast(T, float(value))
    if isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)):
        return value
    expected = _KIND_NAMES.get(kind, f"a {kind.__name__}")
    raise AgentError("BadRequest", f"{name!r} must be {expected}")


def required(frame: Frame, name: str, kind: type[T]) -> T:
    """The request argument ``name``, which must be present and of type ``kind``."""
    if name not in frame or frame[name] is None:
        raise AgentError("BadRequest", f"missing argument {name!r}")
    return _check(name, frame[name], kind)


def optional(frame: Frame, name: str, kind: type[T], default: D) -> T | D:
    """The request argument ``name`` if present (and of type ``kind``), else ``default``."""
    value = frame.get(name)
    if value is None:
        return default
    return _check(name, value, kind)
