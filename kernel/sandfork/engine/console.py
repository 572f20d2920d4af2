"""A sandbox's console log as the API serves it (PandaStack's ``logs``): its last part, and
the lines written to it after.

The console is what the guest (a VM's serial port: its kernel, init and agent) or the
container's processes outside any request (the agent on its stderr) write; output of commands
and cells goes to their callers instead. The backend owns the file and cuts it when it grows
(a container's shim keeps its last half past 1 MiB), so a follower that finds it shorter than
what it read starts again from its beginning.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

MAX_TAIL_BYTES = 256 * 1024  # of the console a request gets (its lines whole)
POLL_S = 0.2  # how often a follower looks for new lines
_MAX_LINE = 64 * 1024  # a line longer than this is given in parts


def tail(path: Path, limit: int = MAX_TAIL_BYTES) -> tuple[list[str], int]:
    """The whole lines among the file's last ``limit`` bytes, and the offset read up to."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(size - limit, 0))
            data = f.read(limit)
    except FileNotFoundError:
        return [], 0
    start = 0 if size <= limit else data.find(b"\n") + 1  # the first line may be cut
    end = data.rfind(b"\n") + 1
    lines = data[start:end].decode(errors="replace").splitlines()
    return lines, size - len(data) + end


async def follow(path: Path, offset: int, alive: Callable[[], bool]) -> AsyncIterator[str]:
    """The lines written to ``path`` from ``offset`` on, as they come, while ``alive()``."""
    pending = b""
    while alive():
        await asyncio.sleep(POLL_S)
        try:
            with path.open("rb") as f:
                if f.seek(0, 2) < offset:  # cut by its writer: from the start again
                    offset, pending = 0, b""
                f.seek(offset)
                chunk = f.read(MAX_TAIL_BYTES)
        except FileNotFoundError:
            continue
        offset += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if len(pending) > _MAX_LINE:
            lines, pending = [*lines, pending], b""
        for line in lines:
            yield line.decode(errors="replace")
