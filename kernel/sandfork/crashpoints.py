"""Named points where the engine can be made to die on purpose, for crash-safety tests.

``SANDFORK_CRASH_AT=<name>`` in the engine's environment makes the engine SIGKILL itself the
first time it reaches :func:`crash_point` with that name: the exact instant of a crash that an
outside ``kill`` could only hit by luck (a layer frozen but not yet recorded, a VM spawned but
not yet answering). Its helper processes inherit the variable, and die at their own points
(:data:`HELPER_CRASH_POINTS`). Unset, a point costs one dictionary look-up.
"""

from __future__ import annotations

import os
import signal

CRASH_POINTS = (
    "start.spawned",  # QEMU runs, its pid is recorded, the guest is not up yet
    "snapshot.inventoried",  # a visible snapshot (a cell's checkpoint) has the kernel's
    # variables, nothing is captured yet
    "snapshot.paused",  # paused: a VM with its devices saved, pages not copied; a container
    # dumped, its files not copied
    "snapshot.memory",  # the VM runs on; its memory layer is half written
    "snapshot.frozen",  # the VM's disk layer is frozen, its record still names the old one
    "snapshot.written",  # the capture is complete in its staging folder, not yet listed
    "hibernate.captured",  # a hibernating sandbox's capture is listed, its VM still runs
    "wake.resumed",  # a woken sandbox's VM runs again, its hibernation capture still listed
    "fork.captured",  # the fork's capture is listed (hidden), no child started yet
    "promote.killed",  # a promoted child's parent is killed, the child still names it
    "pause.frozen",  # a pausing sandbox is frozen, its record still says running
    "kill.destroyed",  # the VM is gone, the sandbox is still listed
)
# Points in the engine's helper processes (they inherit its environment): each helper's
# tests kill it there, the engine living on.
HELPER_CRASH_POINTS = (
    "lazy.mount",  # a lazy server read what to serve and is about to mount it
)


def crash_point(name: str) -> None:
    """Die here (SIGKILL, no clean-up) when the environment asks for ``name``."""
    assert name in CRASH_POINTS or name in HELPER_CRASH_POINTS, name
    if os.environ.get("SANDFORK_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
