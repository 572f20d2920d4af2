"""The sandbox a kernel process is attached to, handed on to the process a restart starts.

The kernel writes it next to its connection file once attached (and again when ``%restore``
moves it or a checkpoint is taken); the next process a restart starts on the same connection
file, on the same host, reads it to attach to the same sandbox and go on with the same
checkpoints. Nothing else reads it: other processes ask the kernel itself
(:mod:`sandfork.proxy_kernel.kernel_info`).
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


@dataclass
class Binding:
    """The sandbox the kernel runs in, and whether the kernel created it (and may kill it)."""

    sandbox: Sandbox
    context: str
    owned: bool

    @property
    def leased(self) -> bool:
        """True if the sandbox goes with the kernel: the kernel holds a lease on it."""
        return self.owned and not self.sandbox.persistent


def save_state(path: Path, binding: Binding, checkpoints: dict[str, Any]) -> None:
    """Record the binding and the checkpoint settings; written to a temporary name and
    renamed, so readers never see half a file."""
    data = {
        "sandbox_id": binding.sandbox.id,
        "context": binding.context,
        "owned": binding.owned,
        "checkpoints": checkpoints,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def load_state(path: Path) -> dict[str, Any] | None:
    """The recorded state (``sandbox_id``, ``context``, ``owned``, ``checkpoints``), or None if
    none is."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    data: dict[str, Any] = json.loads(text)
    return data
