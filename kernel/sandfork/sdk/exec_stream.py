"""The exec stream's server-sent events, parsed as they arrive."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sandfork.protocol import SandforkError, error_for


class ExecEvents:
    """Feeds the chunks of ``POST …/exec/stream`` in; calls back with output and keeps the
    exit code or the error the stream ended with."""

    def __init__(
        self,
        on_stdout: Callable[[str], None] | None,
        on_stderr: Callable[[str], None] | None,
    ) -> None:
        self._on = {"stdout": on_stdout, "stderr": on_stderr}
        self._pending = b""
        self._event = ""
        self.exit_code: int | None = None
        self.error: SandforkError | None = None

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the body."""
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self._line(line.rstrip(b"\r").decode("utf-8", "replace"))

    def _line(self, line: str) -> None:
        if line.startswith("event:"):
            self._event = line[6:].strip()
        elif line.startswith("data:"):
            self._data(self._event, json.loads(line[5:]))

    def _data(self, event: str, data: dict[str, Any]) -> None:
        callback = self._on.get(event)
        if callback is not None:
            callback(data["chunk"])
        elif event == "exit":
            self.exit_code = int(data["exit_code"])
        elif event == "error":
            # The kind is on the wire; a stream names no HTTP status (its answer was a 200).
            self.error = error_for(200, str(data["error"]), data.get("kind") or "server_error")

    def outcome(self) -> int:
        """The exit code, or the stream's error raised."""
        if self.error is not None:
            raise self.error
        if self.exit_code is None:
            raise SandforkError(
                "the exec stream ended without an exit code; the outcome is unknown"
            )
        return self.exit_code
