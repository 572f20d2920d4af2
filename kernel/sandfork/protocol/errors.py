"""The error kinds of the API, as the engine names them on the wire and as clients raise them.

A failure answer of the engine is ``{"error": message, "kind": kind}``; a client raises the
class of that kind (:func:`error_for`). The kind is never guessed from the message; an answer
without one (an older engine, a proxy in between) is classed by its HTTP status.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorKind(StrEnum):
    """What went wrong, as the wire names it (``"kind"`` of an error answer or stream event)."""

    AUTH = "auth"
    BAD_REQUEST = "bad_request"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    LIMIT_EXCEEDED = "limit_exceeded"
    TIMEOUT = "timeout"
    SERVER_ERROR = "server_error"
    UNREACHABLE = "unreachable"


class SandforkError(Exception):
    """Base of every error of a Sandfork client; ``status`` is the engine's HTTP status (None
    when the failure is not an answer of the engine), ``kind`` its :class:`ErrorKind`.

    Errors survive pickling with their message and status (a client's errors cross process
    boundaries: multiprocessing, a task queue).
    """

    status: int | None = None
    kind: ErrorKind = ErrorKind.SERVER_ERROR

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.__dict__))


def _rebuild(kind: type[SandforkError], message: str, state: dict[str, Any]) -> SandforkError:
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class AuthError(SandforkError):
    """The engine refused the API key (401)."""

    kind = ErrorKind.AUTH


class BadRequestError(SandforkError):
    """The engine rejected the request (4xx)."""

    kind = ErrorKind.BAD_REQUEST


class NotFoundError(SandforkError):
    """The sandbox, context or file does not exist (404)."""

    kind = ErrorKind.NOT_FOUND


class ConflictError(SandforkError):
    """The sandbox cannot do this now, e.g. it is dead (409)."""

    kind = ErrorKind.CONFLICT


class LimitExceeded(BadRequestError):
    """The engine is at one of its limits: sandboxes, memory, scratch RAM or snapshot quota
    (429); the message names it."""

    kind = ErrorKind.LIMIT_EXCEEDED


class SandboxTimeout(SandforkError):
    """A command or cell ran past its timeout and was stopped, or the sandbox did not answer
    in time (504)."""

    kind = ErrorKind.TIMEOUT


class ServerError(SandforkError):
    """The engine failed (5xx)."""

    kind = ErrorKind.SERVER_ERROR


class EngineUnreachable(SandforkError):
    """No engine answered: none is configured or running, or the connection failed."""

    kind = ErrorKind.UNREACHABLE


ERROR_CLASSES: dict[ErrorKind, type[SandforkError]] = {
    cls.kind: cls
    for cls in (
        AuthError,
        BadRequestError,
        NotFoundError,
        ConflictError,
        LimitExceeded,
        SandboxTimeout,
        ServerError,
        EngineUnreachable,
    )
}
"""The client's exception class of each error kind."""

STATUS_KINDS: dict[int, ErrorKind] = {
    400: ErrorKind.BAD_REQUEST,
    401: ErrorKind.AUTH,
    404: ErrorKind.NOT_FOUND,
    409: ErrorKind.CONFLICT,
    429: ErrorKind.LIMIT_EXCEEDED,
    500: ErrorKind.SERVER_ERROR,
    502: ErrorKind.UNREACHABLE,
    504: ErrorKind.TIMEOUT,
}
"""The kind an answer of this HTTP status has when it names none (others: a 4xx is a bad
request, a 5xx a server error); also each kind's own status."""

for _status, _kind in STATUS_KINDS.items():
    ERROR_CLASSES[_kind].status = _status  # for one raised without an answer


def kind_of(status: int, kind: str | None = None) -> ErrorKind:
    """The error kind of a failure answer: the one it names, else the one of its status."""
    try:
        return ErrorKind(kind) if kind else STATUS_KINDS[status]
    except (ValueError, KeyError):
        return ErrorKind.SERVER_ERROR if status >= 500 else ErrorKind.BAD_REQUEST


def error_for(status: int, message: str, kind: str | None = None) -> SandforkError:
    """The error for an engine's failure answer: its status, message and (when it names one)
    kind."""
    error = ERROR_CLASSES[kind_of(status, kind)](message)
    error.status = status
    return error
