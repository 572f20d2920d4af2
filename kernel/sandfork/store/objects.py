"""Where chunks and manifests are kept: the interface, and a folder that implements it.

Keys are ``/``-separated names (``chunks/ab/ab12…``, ``manifests/<id>.json``). A write is
whole or absent: a reader never sees half an object. :meth:`ObjectStore.put_if_absent` is the
create-only-if-absent put that makes a manifest's appearance the moment a snapshot is durable.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


class StoreError(Exception):
    """The store cannot be used: unreachable, refused credentials, no such bucket, a refused
    write. The message is one line a person can act on."""


class ObjectMissing(StoreError):
    """No object has the key asked for."""


class ObjectStore(Protocol):
    """A flat namespace of immutable objects."""

    def check(self) -> None:
        """Raise :class:`StoreError` (one line) unless the store can be read and written."""

    def exists(self, key: str) -> bool:
        """Whether an object has ``key``."""

    def get(self, key: str) -> bytes:
        """The object ``key`` (:class:`ObjectMissing` if there is none)."""

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` as ``key``, replacing any object there."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``data`` as ``key`` unless an object has it; False if one did (nothing
        written)."""

    def keys(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix``, sorted."""


def _key_path(root: Path, key: str) -> Path:
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") for p in parts) or "\0" in key:
        raise ValueError(f"not an object key: {key[:200]!r}")
    return root.joinpath(*parts)


class FolderObjects:
    """Objects as files under one folder (mode 0700, files 0600): the store of one host, of a
    folder several hosts mount, and of the fast tests. A write is a temporary file renamed (or,
    create-only, hard-linked) into place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def _failing(self, what: str, absent: str | None = None) -> Iterator[None]:
        """The folder's own failures (a full disk, a mount gone) as :class:`StoreError`s
        (``absent``: the key whose absence is :class:`ObjectMissing`)."""
        try:
            yield
        except FileNotFoundError as e:
            if absent is not None:
                raise ObjectMissing(f"no object {absent!r} in {self.root}") from None
            raise StoreError(f"the store folder {self.root} failed {what}: {e}") from e
        except OSError as e:
            raise StoreError(f"the store folder {self.root} failed {what}: {e}") from e

    def check(self) -> None:
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".check-"):
                pass
        except OSError as e:
            raise StoreError(f"the store folder {self.root} is not writable: {e}") from e

    def exists(self, key: str) -> bool:
        return _key_path(self.root, key).is_file()

    def get(self, key: str) -> bytes:
        with self._failing(f"a read of {key}", absent=key):
            return _key_path(self.root, key).read_bytes()

    def _staged(self, key: str, data: bytes) -> tuple[Path, Path]:
        path = _key_path(self.root, key)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return Path(tmp), path

    def put(self, key: str, data: bytes) -> None:
        with self._failing(f"a write of {key}"):
            tmp, path = self._staged(key, data)
            tmp.rename(path)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        with self._failing(f"a write of {key}"):
            tmp, path = self._staged(key, data)
            try:
                os.link(tmp, path)  # fails if the name exists: the file system's create-only
                return True
            except FileExistsError:
                return False
            finally:
                tmp.unlink()

    def keys(self, prefix: str) -> list[str]:
        found = []
        for folder, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith("."):
                    continue  # a write in flight, or the check's probe
                key = os.path.relpath(os.path.join(folder, name), self.root).replace(os.sep, "/")
                if key.startswith(prefix):
                    found.append(key)
        return sorted(found)
