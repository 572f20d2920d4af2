"""Pause a sandbox in place and let it go on (PandaStack's ``pause`` and ``resume``).

Pausing freezes every process of the sandbox where it is (a VM's CPUs stop; a container's
control group is frozen); its memory stays in RAM, so it goes on at once and exactly where it
was. That is not hibernation, which captures the sandbox and frees its memory. A paused
sandbox refuses work (409 naming the resume) rather than waking by itself, keeps its lease
(renewals are accepted), can be killed, and is neither snapshotted nor forked until resumed.
A pause waits, as a hibernation does, for the engine's operations in the sandbox to end (a
cell running in a kernel is frozen with it and goes on after). An engine restart lets every
paused sandbox go on: the backends' adopt does.
"""

from __future__ import annotations

from sandfork.crashpoints import crash_point
from sandfork.engine.db import SandboxRecord
from sandfork.engine.sandboxes import PAUSED, SandboxService


async def pause(sandboxes: SandboxService, sandbox_id: str, wait: float) -> SandboxRecord:
    """Freeze a running sandbox (a paused one is left as it is); a 409 for one that is not
    running, or "busy" when operations in it do not end within ``wait`` seconds."""
    if sandboxes.get(sandbox_id).status == PAUSED:
        return sandboxes.get(sandbox_id)
    sandboxes.live(sandbox_id)  # a 409 for a dead or hibernated one
    async with (
        sandboxes.activity.quiet(sandbox_id, list, wait, what="pause"),
        sandboxes.lock(sandbox_id),
    ):
        record = sandboxes.get(sandbox_id)
        if record.status != PAUSED:
            await sandboxes.live(sandbox_id).instance.freeze()
            crash_point("pause.frozen")
            record.status = PAUSED
            sandboxes.save(record)
        return record


async def unpause(sandboxes: SandboxService, sandbox_id: str) -> SandboxRecord:
    """Let a paused sandbox go on (a running one is left as it is)."""
    async with sandboxes.lock(sandbox_id):
        record = sandboxes.get(sandbox_id)
        if record.status == PAUSED:
            await sandboxes.live(sandbox_id, paused=True).instance.thaw()
            record.status = "running"  # a crash before this: the restart's adopt thaws
            sandboxes.save(record)
        return record
