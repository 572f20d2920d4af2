"""Exceptions of the Sandfork SDK: the engine's error kinds (:mod:`sandfork.protocol`) and
the SDK's own."""

from __future__ import annotations

from sandfork.protocol import (
    AuthError,
    BadRequestError,
    ConflictError,
    EngineUnreachable,
    LimitExceeded,
    NotFoundError,
    SandboxTimeout,
    SandforkError,
    ServerError,
)

__all__ = [
    "AuthError",
    "BadRequestError",
    "CommandFailed",
    "ConflictError",
    "EngineUnreachable",
    "LimitExceeded",
    "NotFoundError",
    "ReplayMismatch",
    "SandboxTimeout",
    "SandforkError",
    "ServerError",
]


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
