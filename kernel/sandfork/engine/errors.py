"""Errors the engine reports to API clients, each with its HTTP status and its
:class:`~sandfork.protocol.ErrorKind` (the answer is ``{"error": message, "kind": kind}``)."""

from __future__ import annotations

from sandfork.protocol import ErrorKind, kind_of


def kind_of_status(status: int) -> ErrorKind:
    """The kind of an engine's answer of ``status`` that names none of its own.

    The engine answered, so a 502 of its own (the guest failed) is a server error, never the
    "unreachable" a client gives a 502 from a proxy in between.
    """
    kind = kind_of(status)
    return ErrorKind.SERVER_ERROR if kind is ErrorKind.UNREACHABLE else kind


class ApiError(Exception):
    """A failure to report as ``{"error": message, "kind": kind}`` with an HTTP status; the
    kind is the class's, else the one of its status (:func:`kind_of_status`)."""

    status = 500
    KIND: ErrorKind | None = None

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.kind = self.KIND or kind_of_status(self.status)


class BadRequest(ApiError):
    """The request is malformed or names something invalid (400)."""

    status = 400
    KIND = ErrorKind.BAD_REQUEST


class NotFound(ApiError):
    """The named sandbox, context or file does not exist (404)."""

    status = 404
    KIND = ErrorKind.NOT_FOUND


class Conflict(ApiError):
    """The sandbox is not in a state that allows the request (409)."""

    status = 409
    KIND = ErrorKind.CONFLICT


class OverLimit(ApiError):
    """The request would go past one of the engine's limits (429); a client raises it as
    :class:`sandfork.protocol.LimitExceeded`."""

    status = 429
    KIND = ErrorKind.LIMIT_EXCEEDED


class Timeout(ApiError):
    """The work ran past its deadline and was stopped (504).

    Its message starts with "timeout": PandaStack's SDK, which reads no kind, maps a 5xx
    saying so to ``SandboxTimeout``.
    """

    status = 504
    KIND = ErrorKind.TIMEOUT


class TooLarge(ApiError):
    """The request (its body, a field, or the file it asks for) is over a limit (413)."""

    status = 413
    KIND = ErrorKind.BAD_REQUEST


class Unresponsive(ApiError):
    """The sandbox's guest agent did not answer within its deadline (504).

    The sandbox keeps running (its info shows the condition in ``error``); it may recover.
    """

    status = 504
    KIND = ErrorKind.TIMEOUT


class BadReply(ApiError):
    """The sandbox's guest agent sent a reply that breaks its protocol (502).

    Guest code runs as root and can forge the agent's replies; the engine refuses them
    rather than trust them. The sandbox keeps running.
    """

    status = 502
    KIND = ErrorKind.SERVER_ERROR
