"""The Python SDK: ``Sandbox.create``, ``exec``, ``create_code_context().run_code`` and files.

Every call has a blocking form (``sandbox.exec(...)``) and an awaitable one
(``await sandbox.async_exec(...)``) for code that runs in an event loop."""

from sandfork.sdk.client import Client
from sandfork.sdk.errors import (
    AuthError,
    BadRequestError,
    CommandFailed,
    ConflictError,
    LimitExceeded,
    NotFoundError,
    ReplayMismatch,
    SandboxTimeout,
    SandforkError,
    ServerError,
)
from sandfork.sdk.explore import Code, Command, ExploreResult, async_explore, explore
from sandfork.sdk.filesystem import Filesystem
from sandfork.sdk.inventory import Inventory, InventoryDiff, Variable, VariableChange, diff
from sandfork.sdk.models import ExecResult, Execution, ExecutionError, Result
from sandfork.sdk.sandbox import CodeContext, Sandbox
from sandfork.sdk.snapshots import Snapshot

__all__ = [
    "AuthError",
    "BadRequestError",
    "Client",
    "Code",
    "CodeContext",
    "Command",
    "CommandFailed",
    "ConflictError",
    "ExecResult",
    "Execution",
    "ExecutionError",
    "ExploreResult",
    "Filesystem",
    "Inventory",
    "InventoryDiff",
    "LimitExceeded",
    "NotFoundError",
    "ReplayMismatch",
    "Result",
    "Sandbox",
    "SandboxTimeout",
    "SandforkError",
    "ServerError",
    "Snapshot",
    "Variable",
    "VariableChange",
    "async_explore",
    "diff",
    "explore",
]
