"""Sandfork: snapshot, restore and fork live sandboxes.

``from sandfork import Sandbox`` gives the SDK; the engine, backends and guest agent live in
the subpackages. The SDK is imported on first use of one of its names, so that a process that
needs only a subpackage (a container sandbox's supervisor starts at every restore) does not pay
for the HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("sandfork.sdk"), name)
    raise AttributeError(f"module 'sandfork' has no attribute {name!r}")
