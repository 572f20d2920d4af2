"""The proxy's own magics: ``%snapshot``, ``%fork``, ``%restore``, ``%sandbox``,
``%checkpoints``, ``%rewind`` and ``%hibernate``.

One of these on the first line of a cell is handled by the proxy, through the SDK, before the
cell reaches the guest kernel; the guest then runs the cell with a one-line stand-in in the
magic's place, which prints the outcome (or raises it as an error, and the rest of the cell does
not run), so execution counts, history, line numbers and busy/idle stay the guest's own. The
rest of the cell runs after the magic: after ``%restore``, in the restored sandbox.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sandfork.protocol import MAX_CHECKPOINTS_KEPT, MAX_FORKS, is_snapshot_id
from sandfork.proxy_kernel.checkpoints import CellCheckpoints
from sandfork.proxy_kernel.hibernation import IdleTimer
from sandfork.sdk import Sandbox, SandforkError, Snapshot

_MAGIC = re.compile(
    r"\A(?P<lead>\s*?)[ \t]*%(?P<name>snapshot|fork|restore|sandbox|checkpoints|rewind|hibernate)"
    r"(?:[ \t]+(?P<arg>[^\n]*?))?"
    r"[ \t\r]*(?:\n|\Z)"
)


class MagicError(Exception):
    """A magic was misused or failed; its message is shown to the user."""


@dataclass
class Magic:
    """A proxy magic on the first line of a cell, and the code after it."""

    name: str
    argument: str
    lead: str  # the blank lines before the magic's line
    rest: str


@dataclass
class Outcome:
    """What a magic did: text to show, and the sandbox to use from now on, if it changed."""

    text: str
    sandbox: Sandbox | None = None


def parse(code: str) -> Magic | None:
    """The proxy magic on the first line of ``code`` (blank lines aside), if there is one."""
    match = _MAGIC.match(code)
    if match is None:
        return None
    lead = "\n" * match["lead"].count("\n")
    return Magic(match["name"], match["arg"] or "", lead, code[match.end() :])


@dataclass
class KernelControls:
    """What the kernel's magics act on besides its sandbox."""

    lease_seconds: float | None = None  # of a sandbox %restore or %rewind creates
    checkpoints: CellCheckpoints = field(default_factory=CellCheckpoints)
    idle: IdleTimer = field(default_factory=lambda: IdleTimer(0))


async def run(magic: Magic, sandbox: Sandbox, controls: KernelControls | None = None) -> Outcome:
    """Run ``magic`` against ``sandbox``; raises :class:`MagicError` on misuse."""
    controls = controls or KernelControls()
    name, argument = magic.name, magic.argument
    if name in ("checkpoints", "rewind"):
        return await _checkpoint_magic(magic, sandbox, controls)
    if name == "hibernate":
        return _hibernate_magic(magic, controls.idle)
    try:
        if name == "snapshot":
            return Outcome((await sandbox.async_snapshot(argument or None)).id)
        if name == "fork":
            children = await sandbox.async_fork_tree(_count(argument))
            return Outcome("\n".join(child.id for child in children))
        if name == "restore":
            snapshot_id = await _snapshot_id(argument, sandbox)
            restored = await restore_for_kernel(snapshot_id, sandbox, controls)
            return Outcome(f"restored {snapshot_id} into {restored.id}", restored)
        return Outcome(describe(await sandbox.async_refresh()))
    except SandforkError as e:
        raise MagicError(f"%{name} failed: {e}") from e


async def restore_for_kernel(
    snapshot_id: str, sandbox: Sandbox, controls: KernelControls
) -> Sandbox:
    """A new sandbox, the kernel's own (leased), restored from ``snapshot_id``; the
    checkpoints go on from there."""
    restored = await Sandbox.async_create(
        from_snapshot=snapshot_id, lease_seconds=controls.lease_seconds, client=sandbox.client
    )
    await controls.checkpoints.moved(restored, snapshot_id)
    return restored


async def _checkpoint_magic(magic: Magic, sandbox: Sandbox, controls: KernelControls) -> Outcome:
    """``%checkpoints [on [KEEP]|off]``, ``%rewind [N]`` and ``%rewind --cell ID``."""
    checkpoints = controls.checkpoints
    words = magic.argument.split()
    try:
        if magic.name == "checkpoints":
            if words == ["off"]:
                checkpoints.enabled = False
            elif words[:1] == ["on"] and len(words) <= 2:
                usage = "%checkpoints on [KEEP]"
                kept = _count(words[1], usage, MAX_CHECKPOINTS_KEPT) if words[1:] else None
                await checkpoints.turn_on(sandbox, kept)
            elif words:
                raise MagicError("usage: %checkpoints [on [KEEP]|off]")
            state = "on" if checkpoints.enabled else "off"
            return Outcome(
                f"checkpoints after every cell: {state} (the last {checkpoints.kept} kept)"
            )
        if words[:1] == ["--cell"] and len(words) == 2:
            target = await checkpoints.before_cell(sandbox, words[1])
            what = f"to before cell {words[1]}"
        elif words[:1] != ["--cell"]:
            cells = _count(magic.argument, "%rewind [N] | %rewind --cell ID", 10**6)
            target = await checkpoints.before_last(sandbox, cells)
            what = f"{cells} cell(s)"
        else:
            raise MagicError("usage: %rewind [N] | %rewind --cell ID")
        restored = await restore_for_kernel(target.id, sandbox, controls)
    except LookupError as e:
        raise MagicError(f"%{magic.name}: {e}") from e
    except SandforkError as e:
        raise MagicError(f"%{magic.name} failed: {e}") from e
    count = target.metadata.get("execution_count") or "none"
    return Outcome(
        f"rewound {what}: the kernel as it was after execution {count} "
        f"({target.id}), now in {restored.id}",
        restored,
    )


def _hibernate_magic(magic: Magic, idle: IdleTimer) -> Outcome:
    """``%hibernate [after SECONDS|off]``: when the idle kernel's sandbox hibernates."""
    words = magic.argument.split()
    if words == ["off"]:
        idle.after = 0
    elif len(words) == 2 and words[0] == "after":
        try:
            seconds = float(words[1])
        except ValueError:
            seconds = -1
        if not 1 <= seconds <= 86400 * 7:
            raise MagicError("usage: %hibernate after SECONDS (1 to 604800)")
        idle.after = seconds
    elif words:
        raise MagicError("usage: %hibernate [after SECONDS|off]")
    return Outcome(idle.describe())


async def _snapshot_id(argument: str, sandbox: Sandbox) -> str:
    """``%restore``'s argument: a snapshot id, or the name of the newest snapshot so named."""
    if is_snapshot_id(argument):
        return argument
    if not argument:
        raise MagicError("usage: %restore SNAPSHOT_ID|NAME")
    for snapshot in await Snapshot.async_list(client=sandbox.client):  # newest first
        if snapshot.name == argument:
            return snapshot.id
    raise MagicError(f"usage: %restore SNAPSHOT_ID|NAME (no snapshot is named {argument!r})")


def describe(sandbox: Sandbox) -> str:
    """``%sandbox``: id, template, isolation, accelerator, memory, CPUs and lineage."""
    lines = [
        f"id: {sandbox.id}",
        f"template: {sandbox.template}",
        f"isolation: {sandbox.isolation or 'vm'}",
        f"accelerator: {sandbox.accelerator or 'unknown'}",
        f"memory: {sandbox.memory_mb} MiB",
        f"cpu: {sandbox.cpu}",
        f"from snapshot: {sandbox.from_snapshot or '-'}",
    ]
    return "\n".join(lines)


def _count(argument: str, usage: str = "%fork [N]", most: int = MAX_FORKS) -> int:
    if not argument:
        return 1
    if not argument.isdigit() or not 1 <= int(argument) <= most:
        raise MagicError(f"usage: {usage}, with N from 1 to {most}")
    return int(argument)


def stand_in(magic: Magic, outcome: Outcome | MagicError) -> str:
    """The cell the guest runs: the magic's line prints the text, or raises the error."""
    if isinstance(outcome, MagicError):
        line = f"raise RuntimeError({str(outcome)!r}) from None"
    else:
        line = f"print({outcome.text!r})"
    return magic.lead + line + ("\n" + magic.rest if magic.rest else "")
