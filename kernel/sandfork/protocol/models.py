"""The records the API shows: a sandbox (:class:`SandboxInfo`) and a snapshot
(:class:`SnapshotInfo`). Each field is defined here once; the engine's records extend these,
the SDKs parse them, and the JSON schema (:mod:`sandfork.protocol.schema`) is made from them.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, get_args, get_origin

from sandfork.protocol.statuses import BootMode, OnExpiry, SandboxStatus, SnapshotStorage

M = TypeVar("M", bound="WireModel")


class WireModel:
    """A record of the API: built from its JSON object and turned back into one.

    Fields are the dataclass fields declared up to :attr:`WIRE_BASE` (a subclass may add
    private state of its own: the engine's record, the SDK's handle); a JSON key the model
    does not know is kept in ``extra`` (an engine newer than the client).
    """

    WIRE_BASE: ClassVar[type]
    extra: dict[str, Any]  # the JSON keys it did not know (set by from_api; not a field)

    @classmethod
    def wire_fields(cls) -> tuple[dataclasses.Field[Any], ...]:
        """The fields the wire carries, in order."""
        names = {f.name for f in dataclasses.fields(cls.WIRE_BASE)}
        return tuple(f for f in dataclasses.fields(cls) if f.name in names)  # type: ignore[arg-type]

    @classmethod
    def api_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The fields of the API's JSON object ``data``, checked and converted, as keywords
        (a missing key takes the field's default; :class:`ValueError` if it has none or a
        value has the wrong type)."""
        if not isinstance(data, dict):
            raise ValueError(f"a {cls.WIRE_BASE.__name__} is a JSON object, not {data!r:.60}")
        hints = _hints(cls.WIRE_BASE)
        values: dict[str, Any] = {}
        for f in cls.WIRE_BASE.wire_fields():  # type: ignore[attr-defined]
            if f.name in data:
                values[f.name] = _convert(data[f.name], hints[f.name], f.name)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"a {cls.WIRE_BASE.__name__} needs {f.name!r}")
        return values

    @classmethod
    def from_api(cls: type[M], data: dict[str, Any], **own: Any) -> M:
        """The record the API's JSON object ``data`` describes (``own``: the subclass's
        other fields)."""
        record = cls(**cls.api_fields(data), **own)
        known = {f.name for f in cls.wire_fields()}
        record.extra = {k: v for k, v in data.items() if k not in known}
        return record

    def to_api(self) -> dict[str, Any]:
        """The JSON object of the API (with the keys it was given and did not know)."""
        data = {f.name: _to_json(getattr(self, f.name)) for f in self.wire_fields()}
        return {**self.__dict__.get("extra", {}), **data}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(value: Any, hint: Any, name: str) -> Any:
    """``value`` checked against the annotation ``hint`` (a copy for lists and dicts)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, name)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in hint)
            raise ValueError(f"{name} must be one of {allowed}, not {value!r:.60}") from None
    expected = origin or hint
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is Any:
        return value
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ValueError(f"{name} must be {_kind(expected)}, not {value!r:.60}")
    if origin is list:
        return [_convert(v, args[0], f"{name}[]") for v in value]
    if origin is dict:
        return {str(k): _convert(v, args[1], f"{name}.{k}") for k, v in value.items()}
    return value


def _kind(t: type) -> str:
    return {str: "text", int: "an integer", float: "a number", bool: "true or false"}.get(
        t, f"a JSON {'array' if t is list else 'object' if t is dict else t.__name__}"
    )


def _to_json(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    return type(value)(value) if isinstance(value, list | dict) else value


@dataclass
class SnapshotInfo(WireModel):
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
    storage: SnapshotStorage = SnapshotStorage.LOCAL  # writing → local → uploading → durable


@dataclass
class SandboxInfo(WireModel):
    """A sandbox as the API shows it (``GET /v1/sandboxes/{id}``): PandaStack's shape plus
    Sandfork's fields."""

    id: str
    template: str
    status: SandboxStatus
    cpu: int
    memory_mb: int
    created_at: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    persistent: bool = False
    from_snapshot: str | None = None
    boot_ms: int | None = None
    boot_mode: BootMode = BootMode.COLD
    backend: str = ""  # what runs it: "vm" or "container"
    isolation: str = ""  # what separates it from the host (the backend's name)
    accelerator: str = ""
    error: str | None = None
    disk: str = ""
    host_access: bool = False  # the guest may reach the host's network (opt-in)
    lease_seconds: float | None = None  # killed when its holder stops renewing for this long
    on_expiry: OnExpiry = OnExpiry.KILL
    fork_parent_id: str | None = None  # of a fork child: the sandbox it was forked from
    fork_tree_id: str | None = None  # of a fork child: the fork call it came from
    promoted_from: str | None = None  # of a promoted child: its former parent
    resumed_from: str | None = None  # of a sandbox made by a resume: the one it continues


SnapshotInfo.WIRE_BASE = SnapshotInfo
SandboxInfo.WIRE_BASE = SandboxInfo
