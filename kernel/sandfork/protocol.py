"""What the engine and its clients agree on: ids, name rules, limits, error kinds and the
snapshot as the API shows it.

The engine, the SDK, the proxy kernel and the server extension all import these from here;
this module imports nothing of Sandfork's, so a client never pulls in engine internals. (The
guest agent keeps its own copy of the default context's name: it runs in the guest with only
its own package.)
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import unicodedata
from dataclasses import dataclass, field
from typing import Any

# -- ids ------------------------------------------------------------------------------------

SANDBOX_ID = r"sbx_[0-9a-f]{16}"  # what new_sandbox_id makes
SNAPSHOT_ID = r"snap_[0-9a-f]{16}"  # what new_snapshot_id makes
CONTEXT_ID = r"[A-Za-z0-9_-]{1,64}"  # a code context's id
DEFAULT_CONTEXT = "default"  # the context every sandbox has; isolated ones get other ids


def new_sandbox_id() -> str:
    """A fresh, unguessable sandbox id."""
    return "sbx_" + secrets.token_hex(8)


def new_snapshot_id() -> str:
    """A fresh, unguessable snapshot id."""
    return "snap_" + secrets.token_hex(8)


def new_fork_tree_id() -> str:
    """A fresh id for the children of one fork call (their ``fork_tree_id``)."""
    return "tree_" + secrets.token_hex(8)


# -- relations the engine records in metadata ------------------------------------------------

FORK_PARENT = "fork_parent_id"  # of a fork child: the sandbox it was forked from
FORK_TREE = "fork_tree_id"  # of a fork child: the fork call it came from (its tree)
PROMOTED_FROM = "promoted_from"  # of a promoted child: its former parent
RESUMED_FROM = "resumed_from"  # of a sandbox made by a resume: the sandbox it continues
HIBERNATION_OF = "hibernation_of"  # of a hibernated sandbox's capture: that sandbox
ENGINE_METADATA_KEYS = frozenset(
    {FORK_PARENT, FORK_TREE, PROMOTED_FROM, RESUMED_FROM, HIBERNATION_OF}
)
"""Written by the engine only (promote, wake and the listing rely on them): a client that
sends one in ``metadata`` is refused."""


def is_snapshot_id(text: str) -> bool:
    """True if ``text`` has the form of a snapshot id (whether or not it exists)."""
    return _SNAPSHOT_ID.fullmatch(text) is not None


_SNAPSHOT_ID = re.compile(SNAPSHOT_ID)

# -- limits ---------------------------------------------------------------------------------

MAX_FORKS = 16  # children of one fork-tree call
MAX_BRANCHES = 8  # branch notebooks of one fork in JupyterLab (the server extension's default)
MAX_SNAPSHOT_NAME = 200  # characters
MAX_ATTACHMENT_BYTES = 64 * 2**20  # all attachments of one snapshot together
INVENTORY_ATTACHMENT = "inventory.json"  # the variable inventory the engine stores; not a client's

# -- name rules (a ValueError names what is wrong; the engine answers it with a 400) ---------

_ATTACHMENT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


# Characters a name may not hold: controls (Cc), format characters (Cf: the bidirectional
# controls U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C among them, which reorder how
# the text around them is shown), line and paragraph separators (Zl, Zp) and lone surrogates
# (Cs). Private-use (Co) and unassigned (Cn) code points are allowed: they carry no direction
# or formatting, and what is unassigned depends on the Unicode version of each Python (an
# emoji newer than the engine's would be refused by it and not by its client).
_NOT_IN_NAMES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# ... except the zero-width (non-)joiners, which emoji sequences and Persian and Indic
# scripts need, and which move no text.
_JOINERS = frozenset({"\u200c", "\u200d"})


def check_snapshot_name(name: str) -> str:
    """``name`` if it is a valid snapshot name, else a :class:`ValueError` saying why.

    A name is 1-:data:`MAX_SNAPSHOT_NAME` characters of printable text: not only spaces (or
    joiners), with no control, format or bidirectional-control character (see
    ``_NOT_IN_NAMES``). The same rule holds for every name a user gives (checkpoints are
    snapshots).
    """
    rule = f"a snapshot name must be 1-{MAX_SNAPSHOT_NAME} printable characters"
    if not isinstance(name, str) or not name or len(name) > MAX_SNAPSHOT_NAME:
        raise ValueError(rule)
    for at, char in enumerate(name):
        if char not in _JOINERS and unicodedata.category(char) in _NOT_IN_NAMES:
            what = " ".join(filter(None, (f"U+{ord(char):04X}", unicodedata.name(char, ""))))
            raise ValueError(
                f"{rule}, without control, format or bidirectional characters "
                f"({what} at position {at})"
            )
    if all(char.isspace() or char in _JOINERS for char in name):
        raise ValueError(f"{rule}, not only spaces")
    return name


def check_attachment_name(name: str) -> str:
    """``name`` if it is a valid attachment name (a plain file name), else a ValueError."""
    if not _ATTACHMENT_NAME.fullmatch(name):
        raise ValueError(
            f"bad attachment name {name!r}: 1-100 of letters, digits, '.', '_' and '-'"
        )
    return name


# -- errors ---------------------------------------------------------------------------------


class SandforkError(Exception):
    """Base of every error of a Sandfork client; ``status`` is the engine's HTTP status (None
    when the failure is not an answer of the engine)."""

    status: int | None = None


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


class EngineUnreachable(SandforkError):
    """No engine answered: none is configured or running, or the connection failed."""


ERROR_KINDS: dict[int, type[SandforkError]] = {
    401: AuthError,
    404: NotFoundError,
    409: ConflictError,
    429: LimitExceeded,
    504: SandboxTimeout,
}
"""The error kind of an engine's failure answer, by HTTP status (others: 4xx is a bad
request, 5xx a server error)."""


_OWN_STATUS: dict[int, type[SandforkError]] = {
    400: BadRequestError,
    500: ServerError,
    502: EngineUnreachable,
    **ERROR_KINDS,
}
for _status, _kind in _OWN_STATUS.items():
    _kind.status = _status  # each kind's own status, for one raised without an answer


def error_for(status: int, message: str) -> SandforkError:
    """The error for an engine's failure answer with this HTTP status and message."""
    kind = ERROR_KINDS.get(status) or (ServerError if status >= 500 else BadRequestError)
    error = kind(message)
    error.status = status
    return error


# -- the snapshot model ---------------------------------------------------------------------


@dataclass
class SnapshotInfo:
    """A snapshot as the API shows it (``GET /v1/snapshots/{id}``)."""

    id: str
    name: str | None
    created_at: str
    sandbox_id: str
    template: str
    parent_id: str | None
    size_bytes: int
    paused_ms: int = 0
    memory_mb: int | None = None
    cpu: int | None = None
    contexts: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    attachments: list[str] = field(default_factory=list)

    @classmethod
    def api_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The fields of the API's JSON object ``data``, checked and converted, as keywords."""
        return {
            "id": str(data["id"]),
            "name": data.get("name"),
            "created_at": str(data["created_at"]),
            "sandbox_id": str(data["sandbox_id"]),
            "template": str(data["template"]),
            "parent_id": data.get("parent_id"),
            "size_bytes": int(data["size_bytes"]),
            "paused_ms": int(data.get("paused_ms") or 0),
            "memory_mb": data.get("memory_mb"),
            "cpu": data.get("cpu"),
            "contexts": list(data.get("contexts") or []),
            "metadata": dict(data.get("metadata") or {}),
            "attachments": list(data.get("attachments") or []),
        }

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> SnapshotInfo:
        """The snapshot the API's JSON object ``data`` describes."""
        return cls(**cls.api_fields(data))

    def to_api(self) -> dict[str, Any]:
        """The JSON object of the API."""
        names = [f.name for f in dataclasses.fields(SnapshotInfo)]
        return {name: _copy(getattr(self, name)) for name in names}


def _copy(value: Any) -> Any:
    return type(value)(value) if isinstance(value, list | dict) else value
