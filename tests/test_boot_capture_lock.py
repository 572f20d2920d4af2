"""Engines that share the boot-capture cache build a missing capture once between them.

Every engine of a user (JupyterLab's, a CLI's, a test run's) keeps its boot captures in one
cache. Two that need the same missing capture at once must not both build it into the same
folder: the second waits for the first (a lock per key, across processes) and uses its
capture. Here the two engines are two caches over one folder, on the fake backend.
"""

from __future__ import annotations

import asyncio
import fcntl
from pathlib import Path

import pytest

from engine_fake import template
from sandfork.backends.base import MachineSpec
from sandfork.backends.fake import FakeBackend, FakeHost
from sandfork.engine import boot_captures
from sandfork.engine.boot_captures import BootCaptures


@pytest.mark.asyncio
async def test_two_engines_build_a_missing_capture_once(
    host: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    waiting = asyncio.Event()  # the second engine is about to wait for the lock
    real_flock = fcntl.flock
    locks_taken = 0

    def flock(fd: int, operation: int) -> None:
        nonlocal locks_taken
        if operation == fcntl.LOCK_EX:
            locks_taken += 1
            if locks_taken == 2:
                loop.call_soon_threadsafe(waiting.set)
        real_flock(fd, operation)

    monkeypatch.setattr(boot_captures.fcntl, "flock", flock)
    built = template(tmp_path)
    spec = MachineSpec("vm", 512, 1, "fake")
    first, second = (
        BootCaptures(tmp_path / "captures", {"vm": FakeBackend(host)}) for _ in range(2)
    )

    building = host.gate("boot_capture")
    one = asyncio.create_task(first.ensure(built, spec))
    await building.reached.wait()
    again = host.gate("boot_capture")  # where a second build would stop
    two = asyncio.create_task(second.ensure(built, spec))
    await asyncio.wait(
        [asyncio.create_task(waiting.wait()), asyncio.create_task(again.reached.wait())],
        return_when=asyncio.FIRST_COMPLETED,
    )
    assert not again.reached.is_set(), "the second engine built the capture too"
    building.opened.set()
    made, used = await asyncio.gather(one, two)
    assert host.calls["boot_capture"] == 1
    assert made.dir == used.dir and made.dir is not None and made.dir.is_dir()
