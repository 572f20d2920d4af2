"""Ids the engine makes and the forms a client may check them against."""

from __future__ import annotations

import re
import secrets

SANDBOX_ID = r"sbx_[0-9a-f]{16}"  # what new_sandbox_id makes
SNAPSHOT_ID = r"snap_[0-9a-f]{16}"  # what new_snapshot_id makes
CONTEXT_ID = r"[A-Za-z0-9_-]{1,64}"  # a code context's id
DEFAULT_CONTEXT = "default"  # the context every sandbox has; isolated ones get other ids

_SNAPSHOT_ID = re.compile(SNAPSHOT_ID)


def new_sandbox_id() -> str:
    """A fresh, unguessable sandbox id."""
    return "sbx_" + secrets.token_hex(8)


def new_snapshot_id() -> str:
    """A fresh, unguessable snapshot id."""
    return "snap_" + secrets.token_hex(8)


def new_fork_tree_id() -> str:
    """A fresh id for the children of one fork call (their ``fork_tree_id``)."""
    return "tree_" + secrets.token_hex(8)


def is_snapshot_id(text: str) -> bool:
    """True if ``text`` has the form of a snapshot id (whether or not it exists)."""
    return _SNAPSHOT_ID.fullmatch(text) is not None
