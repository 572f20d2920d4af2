"""Sandfork: snapshot, restore and fork live sandboxes.

``from sandfork import Sandbox`` gives the SDK; the engine, backends and guest agent live in
the subpackages.
"""

from sandfork.sdk import (
    Client,
    CodeContext,
    CommandFailed,
    ExecResult,
    Execution,
    NotFoundError,
    ReplayMismatch,
    Sandbox,
    SandboxTimeout,
    SandforkError,
    Snapshot,
)

__all__ = [
    "Client",
    "CodeContext",
    "CommandFailed",
    "ExecResult",
    "Execution",
    "NotFoundError",
    "ReplayMismatch",
    "Sandbox",
    "SandboxTimeout",
    "SandforkError",
    "Snapshot",
]
