"""The replay cache of a resumed sandbox: the calls made before its checkpoint, answered in
order without a round trip."""

from __future__ import annotations

from typing import Any

from sandfork.protocol import error_for
from sandfork.sdk.errors import ReplayMismatch


class Replay:
    """What a resume returned (``{"seq", "kind", "request", "result"}`` entries), consumed
    as the handle makes the same calls again."""

    def __init__(self, entries: list[dict[str, Any]] | None = None) -> None:
        self._entries = {int(entry["seq"]): entry for entry in entries or []}
        self._calls = 0

    def answer(self, kind: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """The recorded result of the next call if the cache covers it (None: run it live).

        :raises ReplayMismatch: the call differs from the one recorded at this point.
        :raises SandforkError: the recorded call failed: it fails the same way again.
        """
        self._calls += 1
        entry = self._entries.pop(self._calls, None)
        if entry is None:
            return None
        if entry["kind"] != kind or entry["request"] != request:
            recorded = {"kind": entry["kind"], **entry["request"]}
            raise ReplayMismatch(self._calls, recorded, {"kind": kind, **request})
        failed = entry["result"].get("failed")
        if failed is not None:
            raise error_for(failed["status"], failed["error"], failed.get("kind"))
        return entry["result"]  # type: ignore[no-any-return]
