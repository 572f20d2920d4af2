"""Progress of long operations (snapshot, restore, fork), polled by the front end."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from sandfork.jupyter.errors import http_error

_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
KEEP_FINISHED = 60.0  # seconds a finished operation stays readable


@dataclass
class Operation:
    """One long operation: a title, the current step, and how far along it is."""

    id: str
    title: str
    total: int
    step: str = "starting"
    done: int = 0
    state: str = "running"  # "running", "done" or "failed"
    error: str | None = None
    finished_at: float | None = field(default=None, repr=False)

    def advance(self, step: str) -> None:
        """Mark the previous step done and start ``step``."""
        if self.step != "starting":
            self.done += 1
        self.step = step

    def to_api(self) -> dict[str, Any]:
        """The operation as the REST API shows it."""
        data = {k: v for k, v in self.__dict__.items() if k != "finished_at"}
        return data if self.error else {k: v for k, v in data.items() if k != "error"}


class Operations:
    """The operations of one server: running ones, and those finished in the last minute."""

    def __init__(self) -> None:
        self._ops: dict[str, Operation] = {}

    def start(self, op_id: str | None, title: str, total: int) -> Operation:
        """Register an operation under the client's id (or an anonymous one)."""
        self._expire()
        if op_id is not None:
            if not isinstance(op_id, str) or not _ID.fullmatch(op_id):
                raise http_error(400, "operation must be 1-64 characters of A-Z a-z 0-9 _ -")
            if op_id in self._ops and self._ops[op_id].state == "running":
                raise http_error(409, f"operation {op_id} is already running")
        op = Operation(op_id or "", title, total)
        if op_id:
            self._ops[op_id] = op
        return op

    def finish(self, op: Operation, error: str | None = None) -> None:
        """Mark ``op`` done, or failed with ``error``."""
        op.state = "failed" if error else "done"
        op.error = error
        if not error:
            op.done, op.step = op.total, "done"
        op.finished_at = time.monotonic()

    def get(self, op_id: str) -> Operation:
        """A running or recently finished operation, or 404."""
        self._expire()
        op = self._ops.get(op_id)
        if op is None:
            raise http_error(404, f"no operation {op_id[:64]!r}")
        return op

    def _expire(self) -> None:
        now = time.monotonic()
        for op_id, op in list(self._ops.items()):
            if op.finished_at is not None and now - op.finished_at > KEEP_FINISHED:
                del self._ops[op_id]
