"""Named points where the engine can be made to wait on purpose, for tests of operations in
flight.

A sibling of :mod:`sandfork.crashpoints`: where a crash point kills the engine at an exact
instant, a hold point parks one operation there, the rest of the engine serving on, until
the test lets it go, so that a test can act while the operation is surely under way (delete
a snapshot while a sandbox is being restored from it) without relying on the machine being
slow enough to catch it. With ``SANDFORK_HOLD_DIR=<dir>`` in the engine's environment, an
operation reaching :func:`hold_point` ``name`` while the file ``<dir>/<name>`` exists writes
``<dir>/<name>.held`` and waits until ``<dir>/<name>`` is removed. Unset, a point costs one
dictionary look-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

HOLD_POINTS = (
    "restore.in_use",  # a sandbox is being restored from a snapshot, which it holds; no VM yet
    "snapshot.capture",  # a snapshot has the sandbox's lock, nothing captured yet
    "snapshot.writing",  # a snapshot is listed ``writing``: its memory layer is not written yet
    "lazy.fill",  # a lazy server's fill, before each chunk (reads of the mount go on)
    "lazy.background",  # a restored container's lazy pages, before the background copy
)

_POLL_S = 0.01


def _gate(name: str) -> Path | None:
    folder = os.environ.get("SANDFORK_HOLD_DIR")
    if folder is None:
        return None
    gate = Path(folder) / name
    return gate if gate.exists() else None


@contextlib.contextmanager
def _holding(gate: Path) -> Iterator[None]:
    held = gate.with_name(f"{gate.name}.held")
    held.touch()
    try:
        yield
    finally:
        held.unlink(missing_ok=True)


async def hold_point(name: str) -> None:
    """Wait here while the hold folder has a file ``name`` (see the module's docstring)."""
    gate = _gate(name)
    if gate is not None:
        with _holding(gate):
            while gate.exists():
                await asyncio.sleep(_POLL_S)


def hold_point_sync(name: str) -> None:
    """:func:`hold_point` for a thread (the lazy server's fill, the lazy pages' copy)."""
    gate = _gate(name)
    if gate is not None:
        with _holding(gate):
            while gate.exists():
                time.sleep(_POLL_S)
