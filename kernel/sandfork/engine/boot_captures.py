"""Boot captures: a template's sandbox booted once, its default kernel idle, captured.

Creating a sandbox restores one of these instead of booting, so only the first sandbox of a
template (per backend, memory size, CPU count, accelerator and hypervisor or CRIU build) pays
for a cold boot. They live in the cache, keyed by those inputs, so every engine and test run
on the machine shares them; a capture is built under a temporary name and renamed into place
when complete, and engines that need the same missing capture at once build it once (a lock
file per key, held across processes). What a capture's folder holds is the backend's
(:meth:`Backend.boot_capture`).

A capture is checked before use against its manifest (every file's size, a checksum of one
of them); a damaged one, or one a restore fails from, is discarded and built again once. Its
disk layer and memory image are the bottom layers of every sandbox made from it (by path: VM
sandboxes map the memory image copy-on-write), so a discarded capture keeps every file its
sandboxes' chains may name, and the rebuild goes to the next generation's directory
(``<template>-<key>``, then ``<template>-<key>.1``, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from sandfork.backends.agent_link import AgentErrorReply
from sandfork.backends.base import Backend, MachineSpec, StartPoint
from sandfork.engine.errors import ApiError
from sandfork.templates import BuiltTemplate

log = logging.getLogger(__name__)

T = TypeVar("T")

MANIFEST = "manifest.json"


def _generations(root: Path, stem: str) -> list[tuple[int, Path]]:
    """The capture directories of one key (discarded ones included), oldest first."""
    found = [(0, root / stem)] if (root / stem).is_dir() else []
    for path in root.glob(f"{stem}.*"):
        if path.suffix[1:].isdigit():
            found.append((int(path.suffix[1:]), path))
    return sorted(found)


@contextlib.asynccontextmanager
async def _held(root: Path, stem: str) -> AsyncIterator[None]:
    """The lock of one key among every engine of the machine (released by the kernel if the
    holder dies, even by SIGKILL)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{stem}.lock", "a+") as f:
        await asyncio.to_thread(fcntl.flock, f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class BootCaptures:
    """The cache of boot captures."""

    def __init__(self, root: Path, backends: dict[str, Backend]) -> None:
        self.root = root
        self.backends = backends
        self._locks: dict[str, asyncio.Lock] = {}

    def key(self, built: BuiltTemplate, spec: MachineSpec) -> str:
        """The cache key: everything the saved state depends on."""
        machine = self.backends[spec.backend].machine_key()
        inputs = json.dumps([built.key, spec.to_dict(), machine], sort_keys=True)
        return hashlib.sha256(inputs.encode()).hexdigest()[:16]

    async def start(
        self,
        built: BuiltTemplate,
        spec: MachineSpec,
        use: Callable[[StartPoint], Awaitable[T]],
    ) -> T:
        """``use`` the capture for ``built`` with ``spec``; if that fails, discard the capture
        and ``use`` a rebuilt one (once: a second failure is not the capture's fault)."""
        current = await self.ensure(built, spec)
        try:
            return await use(current)
        except Exception as e:
            assert current.dir is not None
            log.warning("starting from boot capture %s failed (%s): rebuilding it", current.dir, e)
            self.discard(current.dir, self.backends[spec.backend])
        return await use(await self.ensure(built, spec))

    async def ensure(self, built: BuiltTemplate, spec: MachineSpec) -> StartPoint:
        """The capture for ``built`` with ``spec``, made first if missing or bad."""
        backend = self.backends[spec.backend]
        key = self.key(built, spec)
        stem = f"{built.name}-{key}"
        async with self._locks.setdefault(key, asyncio.Lock()), _held(self.root, stem):
            dirs = _generations(self.root, stem)
            final = next((d for _, d in reversed(dirs) if (d / MANIFEST).exists()), None)
            if final is not None and not await asyncio.to_thread(self.valid, final, backend):
                log.warning("boot capture %s is damaged: rebuilding it", final)
                self.discard(final, backend)
                final = None
            if final is None:
                generation = dirs[-1][0] + 1 if dirs else 0
                final = self.root / (f"{stem}.{generation}" if generation else stem)
                await self._build(built, spec, key, final)
        return backend.capture_at(final, spec)

    @staticmethod
    def checksum(path: Path) -> str:
        """The SHA-256 of a file, as the manifest records it."""
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    @classmethod
    def valid(cls, directory: Path, backend: Backend) -> bool:
        """True if every file of the capture has the size its manifest records, and the one
        the backend names its checksum (memory images are too big to read on every use)."""
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
            files, checksummed = backend.capture_files(directory)
            sizes = manifest["files"]
            names = {str(f.relative_to(directory)) for f in files}
            if not names or names != set(sizes):
                return False
            for name, size in sizes.items():
                if (directory / name).stat().st_size != size:
                    return False
            name = str(checksummed.relative_to(directory))
            return bool(cls.checksum(checksummed) == manifest["sha256"][name])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False

    def discard(self, directory: Path, backend: Backend) -> None:
        """Unlist a capture and free its state; the layers sandboxes and snapshots may lie
        over (its disk and memory image) stay."""
        (directory / MANIFEST).unlink(missing_ok=True)
        keep = backend.capture_at(directory, MachineSpec(backend.name, 0, 0, ""))
        kept = {keep.disk.name, *(m.name for m in keep.memory)}
        for path in list(directory.iterdir()) if directory.is_dir() else []:
            if path.name not in kept:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    async def _build(self, built: BuiltTemplate, spec: MachineSpec, key: str, final: Path) -> None:
        backend = self.backends[spec.backend]
        staging = self.root / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            try:
                await backend.boot_capture(spec, built, staging)
            except AgentErrorReply as e:  # the guest's own answer: the template's fault, say so
                status = 504 if e.type == "Timeout" else 502
                message = f"the first boot of template {built.name} failed: {e.message}"
                raise ApiError(message, status) from e
            except TimeoutError as e:
                message = f"the first boot of template {built.name} did not answer: {e}"
                raise ApiError(message, 504) from e
            files, checksummed = backend.capture_files(staging)
            sizes = {str(p.relative_to(staging)): p.stat().st_size for p in files}
            checksum = await asyncio.to_thread(self.checksum, checksummed)
            manifest = {"template": built.name, "template_key": built.key, "spec": spec.to_dict()}
            manifest |= {
                "files": sizes,
                "sha256": {str(checksummed.relative_to(staging)): checksum},
            }
            (staging / MANIFEST).write_text(json.dumps(manifest))
            try:
                staging.rename(final)
            except OSError:
                if not (final / MANIFEST).exists():
                    raise  # not another process winning the race: a real failure
        finally:
            shutil.rmtree(staging, ignore_errors=True)
