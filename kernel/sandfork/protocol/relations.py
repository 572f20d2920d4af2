"""The relations between sandboxes and snapshots that only the engine writes.

They are fields of the records the API shows (:class:`~sandfork.protocol.models.SandboxInfo`),
and the names below are also refused as keys of a client's ``metadata`` (an older engine kept
them there, and ``promote`` and the listing must never trust a client's word for them).
"""

from __future__ import annotations

FORK_PARENT = "fork_parent_id"  # of a fork child: the sandbox it was forked from
FORK_TREE = "fork_tree_id"  # of a fork child: the fork call it came from (its tree)
PROMOTED_FROM = "promoted_from"  # of a promoted child: its former parent
RESUMED_FROM = "resumed_from"  # of a sandbox made by a resume: the sandbox it continues
HIBERNATION_OF = "hibernation_of"  # of a hibernated sandbox's capture: that sandbox
ENGINE_METADATA_KEYS = frozenset(
    {FORK_PARENT, FORK_TREE, PROMOTED_FROM, RESUMED_FROM, HIBERNATION_OF}
)
"""Written by the engine only: a client that sends one in ``metadata`` is refused."""
