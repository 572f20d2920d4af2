"""The lease a kernel holds on the sandbox it owns: renewed every third of its period for as
long as the kernel process runs, so that the engine kills the sandbox soon after the kernel is
gone however it ended (see :mod:`sandfork.engine.leases`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sandfork.sdk import Sandbox, SandboxTimeout, SandforkError

log = logging.getLogger(__name__)

DEFAULT_SECONDS = 60.0  # grace period of a sandbox whose kernel vanished
LEASE_ENV = "SANDFORK_LEASE_SECONDS"


async def renew(sandbox: Sandbox, seconds: float) -> None:
    """Renew (or start) the lease of ``sandbox`` for ``seconds``; raises ``SandforkError``.

    The request gives up after a third of the period (``SandboxTimeout``): a renewal that
    hangs must not hold up the next one.
    """
    try:
        await asyncio.wait_for(sandbox.async_renew_lease(seconds), seconds / 3)
    except TimeoutError as e:
        raise SandboxTimeout(f"no answer to the lease renewal in {seconds / 3:g} s") from e


async def keep_leased(current: Callable[[], Sandbox | None], seconds: float) -> None:
    """Renew the lease of ``current()`` (None: no lease to keep) every third of ``seconds``,
    until cancelled. Failures are logged and tried again: while the engine restarts, say, the
    next engine gives every lease a fresh period anyway."""
    failing: str | None = None
    while True:
        await asyncio.sleep(seconds / 3)
        sandbox = current()
        if sandbox is not None:
            try:
                await renew(sandbox, seconds)
                failing = None
            except SandforkError as e:
                if failing != sandbox.id:  # once per outage, not every few seconds
                    log.warning("could not renew the lease of sandbox %s: %s", sandbox.id, e)
                failing = sandbox.id
