"""Errors the engine reports to API clients, each with its HTTP status."""

from __future__ import annotations


class ApiError(Exception):
    """A failure to report as ``{"error": message}`` with an HTTP status."""

    status = 500

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class BadRequest(ApiError):
    """The request is malformed or names something invalid (400)."""

    status = 400


class NotFound(ApiError):
    """The named sandbox, context or file does not exist (404)."""

    status = 404


class Conflict(ApiError):
    """The sandbox is not in a state that allows the request (409)."""

    status = 409


class Timeout(ApiError):
    """The work ran past its deadline and was stopped (504).

    A 5xx whose message says "timeout" is what PandaStack's SDK maps to ``SandboxTimeout``.
    """

    status = 504


class TooLarge(ApiError):
    """The request (its body, a field, or the file it asks for) is over a limit (413)."""

    status = 413


class Unresponsive(ApiError):
    """The sandbox's guest agent did not answer within its deadline (504).

    The sandbox keeps running (its info shows the condition in ``error``); it may recover.
    """

    status = 504


class BadReply(ApiError):
    """The sandbox's guest agent sent a reply that breaks its protocol (502).

    Guest code runs as root and can forge the agent's replies; the engine refuses them
    rather than trust them. The sandbox keeps running.
    """

    status = 502
