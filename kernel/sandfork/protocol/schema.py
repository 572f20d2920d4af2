"""The wire's JSON schema, made from :mod:`sandfork.protocol`: the records, the statuses, the
error answer and the limits.

``python -m sandfork.protocol.schema`` prints it; the TypeScript SDK keeps a copy
(``typescript-sdk/src/wire-schema.json``) from which its wire types are generated, and CI
fails when the copy, the generated types or the SDK's own types disagree with this.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from typing import Any, get_args, get_origin

from sandfork.protocol import limits
from sandfork.protocol.errors import ErrorKind
from sandfork.protocol.models import SandboxInfo, SnapshotInfo, WireModel
from sandfork.protocol.statuses import BootMode, OnExpiry, SandboxStatus, SnapshotStorage

MODELS: tuple[type[WireModel], ...] = (SandboxInfo, SnapshotInfo)
ENUMS: tuple[type[enum.Enum], ...] = (SandboxStatus, OnExpiry, BootMode, SnapshotStorage, ErrorKind)
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type(hint: Any) -> dict[str, Any]:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return {"anyOf": [_type(inner), {"type": "null"}]}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"$ref": f"#/$defs/{hint.__name__}"}
    if origin is list:
        return {"type": "array", "items": _type(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type(args[1])}
    if hint is Any:
        return {}
    return {"type": _SCALARS[hint]}


def _model(model: type[WireModel]) -> dict[str, Any]:
    hints = typing.get_type_hints(model)
    fields = model.wire_fields()
    return {
        "type": "object",
        "description": " ".join((model.__doc__ or "").split("\n\n")[0].split()),
        "properties": {f.name: _type(hints[f.name]) for f in fields},
        "required": [
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ],
    }


def schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of the wire."""
    defs: dict[str, Any] = {m.__name__: _model(m) for m in MODELS}
    for e in ENUMS:
        defs[e.__name__] = {"type": "string", "enum": [m.value for m in e]}
    defs["ErrorAnswer"] = {
        "type": "object",
        "description": "What the engine answers a failed request with.",
        "properties": {"error": {"type": "string"}, "kind": {"$ref": "#/$defs/ErrorKind"}},
        "required": ["error", "kind"],
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Sandfork wire",
        "$defs": defs,
        "limits": {name: value for name, value in vars(limits).items() if name.isupper()},
    }


def main() -> None:
    """Print the schema (the copy the TypeScript SDK keeps)."""
    json.dump(schema(), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
