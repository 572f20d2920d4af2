"""Pre-booted template snapshots: a template's VM booted once, its default kernel idle.

Creating a sandbox restores one of these instead of booting, so only the first sandbox of a
template (per memory size, CPU count, accelerator and QEMU build) pays for a cold boot. They
live in the cache, keyed by those inputs, so every engine and test run on the machine shares
them; a capture is built under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfork.backends.vm.qemu import MACHINE_REVISION, create_overlay, qemu_version
from sandfork.templates import BuiltTemplate

CaptureFn = Callable[[dict[str, Any], Path, Path], Awaitable[None]]
"""Boots a VM of a spec on a disk and snapshots it into a directory."""


@dataclass(frozen=True)
class Capture:
    """What a sandbox starts from: a snapshot directory (or ``None`` to boot), its VM spec
    and its disk (the frozen layer of the snapshot, or the disk to boot)."""

    dir: Path | None
    spec: dict[str, Any]
    disk: Path


class BootCaptures:
    """The cache of pre-booted template snapshots."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[str, asyncio.Lock] = {}

    def key(self, built: BuiltTemplate, spec: dict[str, Any]) -> str:
        """The cache key: everything the saved VM state depends on."""
        inputs = json.dumps([built.key, spec, qemu_version(), MACHINE_REVISION], sort_keys=True)
        return hashlib.sha256(inputs.encode()).hexdigest()[:16]

    async def ensure(
        self, built: BuiltTemplate, spec: dict[str, Any], capture: CaptureFn
    ) -> Capture:
        """The capture for ``built`` with ``spec``, made with ``capture`` if missing."""
        key = self.key(built, spec)
        final = self.root / f"{built.name}-{key}"
        async with self._locks.setdefault(key, asyncio.Lock()):
            if not (final / "manifest.json").exists():
                await self._build(built, spec, capture, key, final)
        return Capture(final, spec, final / "disk.qcow2")

    async def _build(
        self, built: BuiltTemplate, spec: dict[str, Any], capture: CaptureFn, key: str, final: Path
    ) -> None:
        staging = self.root / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            disk = staging / "disk.qcow2"
            await asyncio.to_thread(create_overlay, built.rootfs, disk)
            await capture(spec, disk, staging)
            (staging / "manifest.json").write_text(
                json.dumps({"template": built.name, "template_key": built.key, "spec": spec})
            )
            try:
                staging.rename(final)
            except OSError:
                if not (final / "manifest.json").exists():
                    raise  # not another process winning the race: a real failure
        finally:
            shutil.rmtree(staging, ignore_errors=True)
