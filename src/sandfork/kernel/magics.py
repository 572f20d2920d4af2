"""The proxy's own magics: ``%snapshot``, ``%fork``, ``%restore`` and ``%sandbox``.

A cell that is exactly one of these lines is handled by the proxy, through the SDK, before it
reaches the guest kernel; the guest then runs a one-line stand-in that prints the outcome (or
raises it as an error), so execution counts, history and busy/idle stay the guest's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandfork.sdk import Sandbox, SandforkError

_MAGIC = re.compile(r"\A\s*%(snapshot|fork|restore|sandbox)(?:[ \t]+(.*?))?\s*\Z")


class MagicError(Exception):
    """A magic was misused or failed; its message is shown to the user."""


@dataclass
class Outcome:
    """What a magic did: text to show, and the sandbox to use from now on, if it changed."""

    text: str
    sandbox: Sandbox | None = None


def parse(code: str) -> tuple[str, str] | None:
    """``(name, argument)`` when the cell is one proxy magic line, else ``None``."""
    match = _MAGIC.match(code)
    return None if match is None else (match.group(1), match.group(2) or "")


def run(name: str, argument: str, sandbox: Sandbox) -> Outcome:
    """Run magic ``name`` against ``sandbox``; raises :class:`MagicError` on misuse."""
    try:
        if name == "snapshot":
            return Outcome(sandbox.snapshot(argument or None))
        if name == "fork":
            children = sandbox.fork_tree(_count(argument))
            return Outcome("\n".join(child.id for child in children))
        if name == "restore":
            if not re.fullmatch(r"snap_[0-9a-f]{16}", argument):
                raise MagicError("usage: %restore SNAPSHOT_ID")
            restored = Sandbox.create(from_snapshot=argument, client=sandbox.client)
            return Outcome(f"restored {argument} into {restored.id}", restored)
        return Outcome(describe(sandbox))
    except SandforkError as e:
        raise MagicError(f"%{name} failed: {e}") from e


def describe(sandbox: Sandbox) -> str:
    """``%sandbox``: id, template, accelerator, memory, CPUs and lineage."""
    data = sandbox.client.request("GET", f"/sandboxes/{sandbox.id}")
    lines = [
        f"id: {data['id']}",
        f"template: {data['template']}",
        f"accelerator: {data.get('accelerator') or 'unknown'}",
        f"memory: {data['memory_mb']} MiB",
        f"cpus: {data['cpu']}",
        f"from snapshot: {data.get('from_snapshot') or '-'}",
    ]
    return "\n".join(lines)


def _count(argument: str) -> int:
    if not argument:
        return 1
    if not argument.isdigit() or not 1 <= int(argument) <= 16:
        raise MagicError("usage: %fork [N], with N from 1 to 16")
    return int(argument)


def stand_in(outcome: Outcome | MagicError) -> str:
    """The code the guest runs in the magic's place: print the text, or raise the error."""
    if isinstance(outcome, MagicError):
        return f"raise RuntimeError({str(outcome)!r}) from None"
    return f"print({outcome.text!r})"
