"""How a snapshot is laid out in the snapshot store, and the store this engine was given.

A stored snapshot is its state folder (``snapshot``), its disk layers above the template's
image (``disk.0`` the lowest, each a file or a backend's layer directory) and its memory
chain (``memory.0`` the full image, then its deltas), plus ``meta``: the record's fields and
what a restore needs to match here (the backend, its machine key, the template's image it
lies over, the resources). Whatever reads it back trusts none of it (:func:`parse_meta`,
:func:`check_layout`).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfork import manifest_checks as checks
from sandfork.backends.base import Backend
from sandfork.engine.config import EngineConfig
from sandfork.engine.db import SnapshotRecord
from sandfork.engine.lazy_servers import LazyServers, unavailable
from sandfork.engine.manifest import SNAPSHOT_FIELDS, record_fields
from sandfork.engine.snapshot_store import SnapshotStore
from sandfork.store.cache import ChunkCache
from sandfork.store.chunks import ChunkStore
from sandfork.store.config import S3Store
from sandfork.store.manifest import Manifest, ManifestError

log = logging.getLogger(__name__)

STATE = "snapshot"
CHUNK_CACHE = "chunk-cache"  # the chunk cache's folder in the engine's state folder
MAX_LAYERS = 256
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}(/[A-Za-z0-9][A-Za-z0-9._-]{0,199})?")
_RECORD = sorted(SNAPSHOT_FIELDS - {"id", "vm"})
# "cpus" is the CPU count's stored name (MachineSpec.to_dict), kept for what is already stored.
_META = {"snapshot", "backend", "machine_key", "base", "memory_mb", "cpus", "accelerator"}
_META |= {"disk_layers", "memory_layers"}
_TEMPLATE_KEY = re.compile(r"[0-9a-f]{1,64}")


def _fail(problem: str) -> ManifestError:
    return ManifestError(f"the stored snapshot's manifest is invalid: {problem}")


def base_key(base: Path) -> str:
    """What names a template's image across hosts: its folder (the build's key) and name."""
    return f"{base.parent.name}/{base.name}"


def sources(
    snap: SnapshotRecord, store: SnapshotStore, backend: Backend
) -> tuple[dict[str, Path], dict[str, Any]]:
    """What of ``snap`` goes into the store (name -> file or folder), and its meta."""
    chain = backend.images.backing_chain(Path(snap.disk))  # top first, the template's last
    disk = list(reversed(chain[:-1]))
    memory = list(reversed(store.memory_chain(snap.memory)))
    files = {STATE: store.path(snap.id)}
    files |= {f"disk.{i}": layer for i, layer in enumerate(disk)}
    files |= {f"memory.{i}": layer for i, layer in enumerate(memory)}
    meta = {
        "snapshot": {name: getattr(snap, name) for name in _RECORD},
        "backend": snap.backend,
        "machine_key": backend.machine_key(),
        "base": base_key(chain[-1]),
        "memory_mb": snap.vm["memory_mb"],
        "cpus": snap.vm["cpus"],
        "accelerator": snap.vm["accelerator"],
        "disk_layers": len(disk),
        "memory_layers": len(memory),
    }
    return files, meta


@dataclass(frozen=True)
class StoredMeta:
    """A stored snapshot's meta, checked."""

    fields: dict[str, Any]  # the record's (name, created_at, template, ...)
    backend: str
    machine_key: str
    base: str
    memory_mb: int
    cpu: int
    accelerator: str
    disk_layers: int
    memory_layers: int
    template_key: str | None = None  # the template's build, in the store as well


def parse_meta(meta: dict[str, Any], max_memory_mb: int, max_cpus: int) -> StoredMeta:
    """The meta of a fetched manifest if it is one this engine could restore, else
    :class:`ManifestError`."""
    top = checks.fields(meta, "meta", _META, _fail, {"template_key"})
    template_key = top.get("template_key")
    if template_key is not None:
        template_key = checks.matching(template_key, "meta.template_key", _TEMPLATE_KEY, _fail)
    snap = checks.fields(
        top["snapshot"], "meta.snapshot", {"created_at", "sandbox_id", "template"}, _fail, _RECORD
    )
    if top["backend"] not in ("vm", "container"):
        raise _fail("meta.backend must be 'vm' or 'container'")
    return StoredMeta(
        fields=record_fields(snap, _fail),
        backend=top["backend"],
        machine_key=checks.text(top["machine_key"], "meta.machine_key", 200, _fail),
        base=checks.matching(top["base"], "meta.base", _KEY, _fail),
        memory_mb=checks.integer(top["memory_mb"], "meta.memory_mb", 1, max_memory_mb, _fail),
        cpu=checks.integer(top["cpus"], "meta.cpus", 1, max_cpus, _fail),
        accelerator=checks.matching(top["accelerator"], "meta.accelerator", _KEY, _fail),
        disk_layers=checks.integer(top["disk_layers"], "meta.disk_layers", 0, MAX_LAYERS, _fail),
        memory_layers=checks.integer(
            top["memory_layers"], "meta.memory_layers", 0, MAX_LAYERS, _fail
        ),
        template_key=template_key,
    )


def check_layout(manifest: Manifest, meta: StoredMeta) -> None:
    """A :class:`ManifestError` unless the manifest holds exactly the state folder and the
    layers its meta counts, with links, FIFOs and whiteouts only inside disk layers (a
    container's files), never where the engine reads its own files."""
    tops = {STATE: "dir"}
    tops |= {f"disk.{i}": "" for i in range(meta.disk_layers)}
    tops |= {f"memory.{i}": "file" for i in range(meta.memory_layers)}
    seen = set()
    for entry in manifest.entries:
        top = entry.name.split("/")[0]
        if top not in tops:
            raise _fail(f"{entry.name[:200]!r} is not part of a snapshot")
        if entry.name == top:
            if tops[top] and entry.kind != tops[top]:
                raise _fail(f"{top} must be a {tops[top]}")
            if entry.kind not in ("file", "dir"):
                raise _fail(f"{top} must be a file or a directory")
            seen.add(top)
        elif entry.kind not in ("file", "dir") and not top.startswith("disk."):
            raise _fail(f"{entry.name[:200]!r}: a {entry.kind} may only be in a disk layer")
    missing = sorted(set(tops) - seen)
    if missing:
        raise _fail(f"it lacks {missing[0]}")


def lazy_servers(config: EngineConfig, home: Path) -> LazyServers | None:
    """The lazy servers of an engine whose snapshot store is S3 (``None``: every fetch is
    whole, and why is logged where that is not the setting's choice)."""
    if config.snapshot_store == "local" or not config.lazy_fetch:
        return None
    if not config.allow_container or os.geteuid() != 0:
        return None  # only container snapshots are fetched lazily, and containers need root
    why = unavailable()
    if why is not None:
        log.warning("snapshots from the store are fetched whole before a restore: %s", why)
        return None
    settings = S3Store(parent=config)
    store = {name: getattr(settings, name) for name in settings.trait_names(config=True)}
    return LazyServers(home / "lazy", store, home / CHUNK_CACHE)


def open_store(config: EngineConfig, home: Path) -> ChunkStore | None:
    """The snapshot store ``config`` names, checked now (``None``: snapshots stay local).

    Wrong credentials, a missing bucket or an unreachable server are a :class:`StoreError`
    here, at the engine's start, rather than at its first snapshot.
    """
    if config.snapshot_store == "local":
        return None
    from sandfork.store.s3 import S3Objects  # boto3 only for engines that use it

    settings = S3Store(parent=config)
    chunks = ChunkStore(
        S3Objects(settings),
        ChunkCache(home / CHUNK_CACHE, config.chunk_cache_mb * 2**20),
        settings.signing_key,
    )
    chunks.check()
    return chunks
