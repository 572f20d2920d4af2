"""The sandbox a kernel process is attached to, kept next to its connection file.

The kernel writes it once attached (and again when ``%restore`` moves it); the next process a
restart starts on the same connection file reads it to attach to the same sandbox, and the
Jupyter server extension reads it to find the sandbox behind a kernel.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfork.sdk import Sandbox


def state_file(connection_file: str) -> Path:
    """Where the kernel of ``connection_file`` records its sandbox."""
    return Path(connection_file + ".sandfork")


def save_state(path: Path, sandbox_id: str, context: str, owned: bool) -> None:
    """Record the attachment; written to a temporary name and renamed, so readers never see
    half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"sandbox_id": sandbox_id, "context": context, "owned": owned}))
    os.replace(tmp, path)


def load_state(path: Path) -> dict[str, Any] | None:
    """The recorded attachment (``sandbox_id``, ``context``, ``owned``), or None if none is."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    data: dict[str, Any] = json.loads(text)
    return data


@dataclass
class Attachment:
    """The sandbox the kernel runs in, and whether the kernel created it (and may kill it)."""

    sandbox: Sandbox
    context: str
    owned: bool

    def save(self, path: Path) -> None:
        """Remember the attachment for the process a restart starts next."""
        save_state(path, self.sandbox.id, self.context, self.owned)

    @property
    def leased(self) -> bool:
        """True if the sandbox goes with the kernel: the kernel holds a lease on it."""
        return self.owned and not self.sandbox.persistent
