"""What the engine tells a lazy server (:mod:`sandfork.store.lazy_serve`), a line of JSON
each: where it fetches from (:class:`Source`, as soon as it starts), then what it serves
(:class:`Spec`, once a fetch needs it)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sandfork.store.manifest import Entry


def mount_name(name: str) -> str:
    """What the file ``name`` (its path in the snapshot's state folder) is called on the
    mount, which has no folders."""
    return name.replace("/", "-")


@dataclass(frozen=True)
class Served:
    """One file: its path in the snapshot's state folder, where it is written, what it
    holds."""

    name: str
    path: str
    entry: Entry


@dataclass(frozen=True)
class Source:
    """The store a server fetches from."""

    store: dict[str, str]  # S3Store's settings, and its signing key
    cache: str  # the engine's chunk cache folder

    def to_json(self) -> str:
        """The line the engine writes first."""
        return json.dumps({"store": self.store, "cache": self.cache})

    @classmethod
    def from_json(cls, line: str) -> Source:
        """The source the engine wrote."""
        data = json.loads(line)
        return cls(data["store"], data["cache"])


@dataclass(frozen=True)
class Spec:
    """What one server serves: files, on a mount."""

    mount: str
    files: list[Served]

    def to_json(self) -> str:
        """The line the engine writes when a fetch needs the server."""
        files = [
            {"name": f.name, "path": f.path, "size": f.entry.size, "spans": f.entry.spans}
            for f in self.files
        ]
        return json.dumps({"mount": self.mount, "files": files})

    @classmethod
    def from_json(cls, line: str) -> Spec:
        """The spec the engine wrote (trusted: the engine checked the manifest it comes from)."""
        data = json.loads(line)
        files = [
            Served(
                f["name"],
                f["path"],
                Entry(
                    name=f["name"],
                    kind="file",
                    mode=0o400,
                    size=f["size"],
                    spans=tuple((d, int(o), int(n)) for d, o, n in f["spans"]),
                ),
            )
            for f in data["files"]
        ]
        return cls(data["mount"], files)
