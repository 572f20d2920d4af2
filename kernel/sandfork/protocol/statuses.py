"""The states a sandbox goes through, and the other closed sets of words the wire uses."""

from __future__ import annotations

from enum import StrEnum


class SandboxStatus(StrEnum):
    """A sandbox's status (``"status"`` on the wire).

    ``starting`` → ``running`` ⇄ ``paused`` (frozen in place, memory kept) and ``running`` →
    ``hibernated`` (captured, its VM or container stopped) → ``waking`` → ``running``; any of
    them → ``dead`` (killed, or failed: ``error`` says why).
    """

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    HIBERNATED = "hibernated"
    WAKING = "waking"
    DEAD = "dead"

    @property
    def is_hibernated(self) -> bool:
        """Its VM or container is stopped and its state kept in a capture."""
        return self in (SandboxStatus.HIBERNATED, SandboxStatus.WAKING)


class OnExpiry(StrEnum):
    """What a sandbox's lease or time to live running out does to it."""

    KILL = "kill"
    HIBERNATE = "hibernate"


class BootMode(StrEnum):
    """How a sandbox's machine came up: booted, restored from its template's capture, or
    restored from a snapshot."""

    COLD = "cold"
    TEMPLATE = "template"
    SNAPSHOT = "snapshot"


class SnapshotStorage(StrEnum):
    """Where a snapshot is kept (``"storage"`` on the wire): ``writing`` (taken, the sandbox
    runs on, its memory still going from the engine's memory to its disk: a restore waits
    for it), ``local`` (on the disk of the engine that took it, or fetched, only),
    ``uploading`` (its chunks going to the engine's object store) and ``durable`` (its
    manifest is in the store: any engine sharing the store can restore it)."""

    WRITING = "writing"
    LOCAL = "local"
    UPLOADING = "uploading"
    DURABLE = "durable"
