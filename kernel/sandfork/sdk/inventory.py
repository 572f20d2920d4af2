"""What is inside a snapshot: the variable inventory captured with it, and the difference
between two inventories.

The engine stores an inventory with every visible snapshot (the attachment
``inventory.json``): each variable of the default kernel's namespace with its type, shape or
length, approximate size and, where one is cheap, a content fingerprint. Read it with
:meth:`sandfork.sdk.Snapshot.inventory`; compare two with :meth:`sandfork.sdk.Snapshot.diff`
or :func:`diff`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Variable:
    """One variable of a kernel's namespace as the inventory saw it.

    ``type`` is the qualified type name (``int``, ``numpy.ndarray``, ``pandas.DataFrame``);
    ``shape`` is set for arrays and frames, ``length`` for builtin containers and strings,
    ``bytes`` is approximate; ``fingerprint`` (``f:`` over all the content, ``s:`` over a
    sample) is None where no cheap one exists. Fields the inventory could not measure are None.
    """

    name: str
    type: str
    shape: tuple[int, ...] | None = None
    length: int | None = None
    bytes: int | None = None
    fingerprint: str | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Variable:
        """A variable from its JSON object."""
        shape = data.get("shape")
        return cls(
            name=str(data["name"]),
            type=str(data["type"]),
            shape=None if shape is None else tuple(int(n) for n in shape),
            length=data.get("length"),
            bytes=data.get("bytes"),
            fingerprint=data.get("fingerprint"),
        )

    def to_api(self) -> dict[str, Any]:
        """The variable as its JSON object."""
        return {
            "name": self.name,
            "type": self.type,
            "shape": None if self.shape is None else list(self.shape),
            "length": self.length,
            "bytes": self.bytes,
            "fingerprint": self.fingerprint,
        }

    def same_as(self, other: Variable) -> bool:
        """True unless type, shape, length or size differ, or both have fingerprints and
        those differ (a missing fingerprint is no evidence of a change)."""
        if (self.type, self.shape, self.length, self.bytes) != (
            other.type,
            other.shape,
            other.length,
            other.bytes,
        ):
            return False
        return (
            self.fingerprint is None
            or other.fingerprint is None
            or (self.fingerprint == other.fingerprint)
        )


@dataclass(frozen=True)
class Inventory:
    """The variables of a snapshot's default kernel, sorted by name.

    ``status`` is ``"ok"``, or ``"unavailable"`` with a ``reason`` (the kernel was busy with
    a cell, its answer was refused, the snapshot predates inventories): then ``variables`` is
    empty. ``truncated`` says a bound (time, count, size) cut the list short.
    """

    status: str
    reason: str | None = None
    truncated: bool = False
    elapsed_ms: int = 0
    variables: tuple[Variable, ...] = ()

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Inventory:
        """An inventory from the JSON of ``inventory.json``."""
        return cls(
            status=str(data["status"]),
            reason=data.get("reason"),
            truncated=bool(data.get("truncated", False)),
            elapsed_ms=int(data.get("elapsed_ms", 0)),
            variables=tuple(Variable.from_api(v) for v in data.get("variables", [])),
        )

    @classmethod
    def unavailable(cls, reason: str) -> Inventory:
        """An inventory that could not be had, and why."""
        return cls(status="unavailable", reason=reason)

    @classmethod
    def missing(cls) -> Inventory:
        """The inventory of a snapshot stored without one (taken before inventories existed)."""
        return cls.unavailable("the snapshot was taken before inventories existed")

    def to_api(self) -> dict[str, Any]:
        """The inventory as the JSON of ``inventory.json``."""
        return {
            "status": self.status,
            "reason": self.reason,
            "truncated": self.truncated,
            "elapsed_ms": self.elapsed_ms,
            "variables": [v.to_api() for v in self.variables],
        }

    @property
    def available(self) -> bool:
        """True when the inventory was taken (``status == "ok"``)."""
        return self.status == "ok"

    def get(self, name: str) -> Variable | None:
        """The variable called ``name``, if listed."""
        return next((v for v in self.variables if v.name == name), None)


@dataclass(frozen=True)
class VariableChange:
    """A variable present in both inventories that changed."""

    name: str
    before: Variable
    after: Variable


@dataclass(frozen=True)
class InventoryDiff:
    """What changed from one snapshot's inventory (``from_id``) to another's (``to_id``)."""

    from_id: str
    to_id: str
    added: tuple[Variable, ...] = ()
    removed: tuple[Variable, ...] = ()
    changed: tuple[VariableChange, ...] = ()
    unchanged: tuple[str, ...] = ()

    def to_api(self) -> dict[str, Any]:
        """The diff as JSON: ``{"from", "to", "added", "removed", "changed": [{"name",
        "before", "after"}], "unchanged": [names]}``."""
        return {
            "from": self.from_id,
            "to": self.to_id,
            "added": [v.to_api() for v in self.added],
            "removed": [v.to_api() for v in self.removed],
            "changed": [
                {"name": c.name, "before": c.before.to_api(), "after": c.after.to_api()}
                for c in self.changed
            ],
            "unchanged": list(self.unchanged),
        }


def diff(a: Inventory, b: Inventory, from_id: str, to_id: str) -> InventoryDiff:
    """Variables added, removed, changed and unchanged from ``a`` to ``b``, each by name.

    Changed means a different type, shape, length or size, or fingerprints that are both
    present and differ. An unavailable or truncated inventory lists fewer variables than the
    kernel had: check ``status`` and ``truncated`` before reading "added" or "removed" as
    such.
    """
    before = {v.name: v for v in a.variables}
    after = {v.name: v for v in b.variables}
    common = sorted(before.keys() & after.keys())
    return InventoryDiff(
        from_id=from_id,
        to_id=to_id,
        added=tuple(after[n] for n in sorted(after.keys() - before.keys())),
        removed=tuple(before[n] for n in sorted(before.keys() - after.keys())),
        changed=tuple(
            VariableChange(n, before[n], after[n])
            for n in common
            if not before[n].same_as(after[n])
        ),
        unchanged=tuple(n for n in common if before[n].same_as(after[n])),
    )
