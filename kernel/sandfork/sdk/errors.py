"""Exceptions of the Sandfork SDK."""

from __future__ import annotations


class SandforkError(Exception):
    """Base of every SDK error."""


class AuthError(SandforkError):
    """The engine refused the API key (401)."""


class BadRequestError(SandforkError):
    """The engine rejected the request (4xx)."""


class NotFoundError(SandforkError):
    """The sandbox, context or file does not exist (404)."""


class ConflictError(SandforkError):
    """The sandbox cannot do this now, e.g. it is dead (409)."""


class LimitExceeded(BadRequestError):
    """The engine is at one of its limits: sandboxes, memory, scratch RAM or snapshot quota
    (429); the message names it."""


class SandboxTimeout(SandforkError):
    """A command or cell ran past its timeout and was stopped."""


class ServerError(SandforkError):
    """The engine failed (5xx)."""


class CommandFailed(SandforkError):
    """``exec(..., check=True)`` saw a non-zero exit code."""

    def __init__(self, message: str, *, exit_code: int, stdout: str, stderr: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


class ReplayMismatch(SandforkError):
    """A resumed sandbox was asked, at a sequence number its replay cache covers, for a
    call other than the one the original sandbox made there."""

    def __init__(self, seq: int, expected: dict[str, object], got: dict[str, object]) -> None:
        super().__init__(
            f"call #{seq} differs from the ledger: it recorded {expected}, this call is {got}"
        )
        self.seq = seq
        self.expected = expected
        self.got = got
