"""Templates travel through the snapshot store with the snapshots made from them, so a host
that restores a snapshot it lacks needs no template build.

Before a snapshot's manifest is written, the exact build of the template it lies over goes up
as the store's object ``template-<name>-<key>``: the template's export file
(:mod:`sandfork.templates.exchange`, made once per build and kept in the cache) as chunks
under a signed manifest, sent once per build for the whole fleet, and the snapshot's meta
names that key. A host that fetches the snapshot
and lacks that build fetches the file and imports it, which checks it as hostile input like
any imported template, then finds the template as if it had built it.
"""

from __future__ import annotations

import logging
import re
import secrets
import shutil
import time
from pathlib import Path

from sandfork.backends.base import Backend
from sandfork.engine.stored import base_key
from sandfork.paths import cache_dir
from sandfork.store.chunks import ChunkStore
from sandfork.store.manifest import ManifestError
from sandfork.templates import BuiltTemplate
from sandfork.templates.cache import build_lock
from sandfork.templates.exchange import export_template, import_template

log = logging.getLogger(__name__)

FILE = "template"  # the one file of a template's object in the store


def object_id(name: str, key: str) -> str:
    """The store's name for the build ``key`` of the template ``name``."""
    return f"template-{name}-{key}"


class TemplateTravel:
    """Templates up to ``chunks`` and down from it, through the folder ``tmp_dir``."""

    def __init__(self, chunks: ChunkStore, tmp_dir: Path) -> None:
        self.chunks = chunks
        self.tmp_dir = tmp_dir
        self._stored: set[str] = set()  # objects known to be in the store

    def upload(self, name: str, base: str, backend: Backend) -> str | None:
        """Put the build of template ``name`` whose image ``backend`` knows as ``base``
        into the store unless it is there; its key, or ``None`` if that build is here no
        more (rebuilt since: the snapshot restores only where it is built)."""
        built = BuiltTemplate.find(name)
        if built is None or base_key(backend.base_disk(built)) != base:
            log.warning(
                "template %r of image %s is not built here: not put in the store", name, base
            )
            return None
        ident = object_id(name, built.key)
        if ident in self._stored or self.chunks.is_durable(ident):
            self._stored.add(ident)
            return built.key
        started = time.monotonic()
        export = _export(built)
        if export is None:
            return None
        done = self.chunks.upload(ident, {FILE: export}, {"key": built.key})
        self._stored.add(ident)
        log.info(
            "template %r (%s) is in the store: %.1f MiB sent in %.1f s",
            name, built.key, done.bytes_sent / 2**20, time.monotonic() - started,
        )  # fmt: skip
        return built.key

    def ensure(self, name: str, key: str, max_bytes: int) -> None:
        """Make the build ``key`` of template ``name`` a template of this host, from the
        store, if it is not one already and the store has it (else the caller builds)."""
        built = BuiltTemplate.find(name)
        if built is not None and built.key == key:
            return
        ident = object_id(name, key)
        manifest = self.chunks.manifest(ident, max_bytes)
        if manifest is None:
            return
        if [(e.name, e.kind) for e in manifest.entries] != [(FILE, "file")]:
            raise ManifestError(f"the store's {ident} is not one template file")
        started = time.monotonic()
        folder = self._folder(ident)
        try:
            self.chunks.fetch(manifest, folder / "fetched")
            import_template(folder / "fetched" / FILE)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        log.info(
            "fetched template %r (%s) from the store: %.1f MiB in %.1f s",
            name, key, manifest.total_bytes / 2**20, time.monotonic() - started,
        )  # fmt: skip

    def _folder(self, ident: str) -> Path:
        """A new private folder under ``tmp_dir``."""
        folder = self.tmp_dir / f"{ident}-{secrets.token_hex(4)}"
        folder.mkdir(mode=0o700)
        return folder


def _export(built: BuiltTemplate) -> Path | None:
    """The export file of ``built``, made once per build and kept in the cache (only the
    newest build's of each template); ``None`` if the template was rebuilt as it was
    exported."""
    folder = cache_dir() / "template-exports"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"{object_id(built.name, built.key)}.tar.zst"
    with build_lock(folder):
        if not path.is_file():
            export = export_template(built.name, path)
            if (export.boot_key, export.rootfs_key) != (built.boot_key, built.rootfs_key):
                path.unlink()
                return None
            earlier = re.compile(rf"{re.escape(object_id(built.name, ''))}[0-9a-f]+\.tar\.zst")
            for older in folder.iterdir():
                if older != path and earlier.fullmatch(older.name):
                    older.unlink()  # an earlier build's, in the store already
    return path
