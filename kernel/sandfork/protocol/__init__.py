"""What the engine and its clients agree on: ids, names, limits, statuses, error kinds, routes
and the records the API shows.

The engine, the SDKs, the proxy kernel and the server extension all take these from here; this
package imports nothing else of Sandfork's, so a client never pulls in engine internals. (The
guest agent keeps its own copy of the default context's name: it runs in the guest with only
its own package.) The TypeScript SDK's types are checked against the JSON schema made from it
(:mod:`sandfork.protocol.schema`).
"""

from sandfork.protocol import routes
from sandfork.protocol.errors import (
    ERROR_CLASSES,
    STATUS_KINDS,
    AuthError,
    BadRequestError,
    ConflictError,
    EngineUnreachable,
    ErrorKind,
    LimitExceeded,
    NotFoundError,
    SandboxTimeout,
    SandforkError,
    ServerError,
    error_for,
    kind_of,
)
from sandfork.protocol.ids import (
    CONTEXT_ID,
    DEFAULT_CONTEXT,
    SANDBOX_ID,
    SNAPSHOT_ID,
    is_snapshot_id,
    new_fork_tree_id,
    new_sandbox_id,
    new_snapshot_id,
)
from sandfork.protocol.limits import (
    CHECKPOINTS_KEPT,
    DEFAULT_MEMORY_MB,
    DEFAULT_TEMPLATE,
    MAX_ATTACHMENT_BYTES,
    MAX_BRANCHES,
    MAX_CHECKPOINTS_KEPT,
    MAX_FORKS,
    MAX_SNAPSHOT_NAME,
    MIN_MEMORY_MB,
)
from sandfork.protocol.models import SandboxInfo, SnapshotInfo, WireModel
from sandfork.protocol.names import (
    INVENTORY_ATTACHMENT,
    check_attachment_name,
    check_snapshot_name,
)
from sandfork.protocol.relations import (
    ENGINE_METADATA_KEYS,
    FORK_PARENT,
    FORK_TREE,
    HIBERNATION_OF,
    PROMOTED_FROM,
    RESUMED_FROM,
)
from sandfork.protocol.statuses import BootMode, OnExpiry, SandboxStatus, SnapshotStorage

__all__ = [
    "CHECKPOINTS_KEPT",
    "CONTEXT_ID",
    "DEFAULT_CONTEXT",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TEMPLATE",
    "ENGINE_METADATA_KEYS",
    "ERROR_CLASSES",
    "FORK_PARENT",
    "FORK_TREE",
    "HIBERNATION_OF",
    "INVENTORY_ATTACHMENT",
    "MAX_ATTACHMENT_BYTES",
    "MAX_BRANCHES",
    "MAX_CHECKPOINTS_KEPT",
    "MAX_FORKS",
    "MAX_SNAPSHOT_NAME",
    "MIN_MEMORY_MB",
    "PROMOTED_FROM",
    "RESUMED_FROM",
    "SANDBOX_ID",
    "SNAPSHOT_ID",
    "STATUS_KINDS",
    "AuthError",
    "BadRequestError",
    "BootMode",
    "ConflictError",
    "EngineUnreachable",
    "ErrorKind",
    "LimitExceeded",
    "NotFoundError",
    "OnExpiry",
    "SandboxInfo",
    "SandboxStatus",
    "SandboxTimeout",
    "SandforkError",
    "ServerError",
    "SnapshotInfo",
    "SnapshotStorage",
    "WireModel",
    "check_attachment_name",
    "check_snapshot_name",
    "error_for",
    "is_snapshot_id",
    "kind_of",
    "new_fork_tree_id",
    "new_sandbox_id",
    "new_snapshot_id",
    "routes",
]
