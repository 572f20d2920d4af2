"""Boot captures: a template's VM booted once, its default kernel idle, captured.

Creating a sandbox restores one of these instead of booting, so only the first sandbox of a
template (per memory size, CPU count, accelerator and QEMU build) pays for a cold boot. They
live in the cache, keyed by those inputs, so every engine and test run on the machine shares
them; a capture is built under a temporary name and renamed into place when complete.

A capture is checked before use against its manifest (every file's size, a checksum of the
device state); a damaged one, or one a restore fails from, is discarded and built again once.
Its ``disk.qcow2`` and ``memory.img`` are the bottom layers of every sandbox made from it (by
path: sandboxes map the memory image copy-on-write), so a discarded capture keeps both files
where they are and the rebuild goes to the next generation's directory
(``<template>-<key>``, then ``<template>-<key>.1``, ...).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sandfork.backends.base import Backend
from sandfork.templates import BuiltTemplate

log = logging.getLogger(__name__)

T = TypeVar("T")

MANIFEST = "manifest.json"
DISK = "disk.qcow2"
MEMORY = "memory.img"
CHECKSUMMED = "devices.state"


@dataclass(frozen=True)
class Capture:
    """What a sandbox starts from: a snapshot directory (or ``None`` to boot), its VM spec,
    its disk (the frozen layer of the snapshot, or the disk to boot) and its memory chain
    (top first; empty to boot)."""

    dir: Path | None
    spec: dict[str, Any]
    disk: Path
    memory: list[Path]


def _generations(root: Path, stem: str) -> list[tuple[int, Path]]:
    """The capture directories of one key (discarded ones included), oldest first."""
    found = [(0, root / stem)] if (root / stem).is_dir() else []
    for path in root.glob(f"{stem}.*"):
        if path.suffix[1:].isdigit():
            found.append((int(path.suffix[1:]), path))
    return sorted(found)


class BootCaptures:
    """The cache of boot captures."""

    def __init__(self, root: Path, backend: Backend) -> None:
        self.root = root
        self.backend = backend
        self._locks: dict[str, asyncio.Lock] = {}

    def key(self, built: BuiltTemplate, spec: dict[str, Any]) -> str:
        """The cache key: everything the saved VM state depends on."""
        inputs = json.dumps([built.key, spec, self.backend.machine_key()], sort_keys=True)
        return hashlib.sha256(inputs.encode()).hexdigest()[:16]

    async def start(
        self,
        built: BuiltTemplate,
        spec: dict[str, Any],
        use: Callable[[Capture], Awaitable[T]],
    ) -> T:
        """``use`` the capture for ``built`` with ``spec``; if that fails, discard the capture
        and ``use`` a rebuilt one (once: a second failure is not the capture's fault)."""
        current = await self.ensure(built, spec)
        try:
            return await use(current)
        except Exception as e:
            assert current.dir is not None
            log.warning("starting from boot capture %s failed (%s): rebuilding it", current.dir, e)
            self.discard(current.dir)
        return await use(await self.ensure(built, spec))

    async def ensure(self, built: BuiltTemplate, spec: dict[str, Any]) -> Capture:
        """The capture for ``built`` with ``spec``, made first if missing or bad."""
        key = self.key(built, spec)
        stem = f"{built.name}-{key}"
        async with self._locks.setdefault(key, asyncio.Lock()):
            dirs = _generations(self.root, stem)
            final = next((d for _, d in reversed(dirs) if (d / MANIFEST).exists()), None)
            if final is not None and not await asyncio.to_thread(self.valid, final):
                log.warning("boot capture %s is damaged: rebuilding it", final)
                self.discard(final)
                final = None
            if final is None:
                generation = dirs[-1][0] + 1 if dirs else 0
                final = self.root / (f"{stem}.{generation}" if generation else stem)
                await self._build(built, spec, key, final)
        return Capture(final, spec, final / DISK, [final / MEMORY])

    @staticmethod
    def checksum(path: Path) -> str:
        """The SHA-256 of a file, as the manifest records it."""
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    @classmethod
    def valid(cls, directory: Path) -> bool:
        """True if every file of the capture has the size its manifest records and the
        device state its checksum (the memory image is too big to read on every use)."""
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
            sizes = manifest["files"]
            for name, size in sizes.items():
                if (directory / name).stat().st_size != size:
                    return False
            return bool(
                DISK in sizes
                and MEMORY in sizes
                and CHECKSUMMED in sizes
                and cls.checksum(directory / CHECKSUMMED) == manifest["sha256"][CHECKSUMMED]
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False

    def discard(self, directory: Path) -> None:
        """Unlist a capture and free its state; its disk and memory image stay for the
        sandboxes and snapshots over them."""
        (directory / MANIFEST).unlink(missing_ok=True)
        for path in list(directory.iterdir()) if directory.is_dir() else []:
            if path.name not in (DISK, MEMORY):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    async def _build(
        self, built: BuiltTemplate, spec: dict[str, Any], key: str, final: Path
    ) -> None:
        staging = self.root / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            disk = staging / DISK
            await asyncio.to_thread(self.backend.images.create_overlay, built.rootfs, disk)
            await self._boot_and_capture(spec, disk, staging)
            files = {p.name: p.stat().st_size for p in staging.iterdir() if p.is_file()}
            checksum = await asyncio.to_thread(self.checksum, staging / CHECKSUMMED)
            manifest = {"template": built.name, "template_key": built.key, "spec": spec}
            manifest |= {"files": files, "sha256": {CHECKSUMMED: checksum}}
            (staging / MANIFEST).write_text(json.dumps(manifest))
            try:
                staging.rename(final)
            except OSError:
                if not (final / MANIFEST).exists():
                    raise  # not another process winning the race: a real failure
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    async def _boot_and_capture(self, spec: dict[str, Any], disk: Path, dest: Path) -> None:
        """Cold-boot a VM on ``disk``, start its default kernel, and capture it into ``dest``."""
        # Named uniquely: its RAM file and sockets share the engine's RAM folder.
        instance = await self.backend.create(spec, dest / f"boot-{secrets.token_hex(6)}", disk)
        try:
            await instance.agent.request("ctx.create", {"isolated": False}, wait=300)
            await instance.snapshot(dest, dest / "scratch.qcow2", dest / MEMORY, [])
        finally:
            await instance.destroy()
            (dest / "scratch.qcow2").unlink(missing_ok=True)
