"""Results returned by the SDK: exec results and code executions with rich outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ExecResult:
    """The outcome of a shell command."""

    stdout: str
    stderr: str
    exit_code: int
    duration_ms: int = 0
    truncated: bool = False

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> ExecResult:
        return cls(
            stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""),
            exit_code=int(data.get("exit_code", 0)),
            duration_ms=int(data.get("duration_ms", 0)),
            truncated=bool(data.get("truncated", False)),
        )


@dataclass(frozen=True)
class Result:
    """One MIME representation of an output (``type`` is the MIME type)."""

    type: str
    data: str
    is_main_result: bool = False


@dataclass(frozen=True)
class ExecutionError:
    """The exception a cell raised."""

    name: str
    value: str
    traceback: list[str]

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@dataclass(frozen=True)
class Execution:
    """What running a cell produced."""

    results: list[Result] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    error: ExecutionError | None = None
    execution_count: int | None = None
    duration_ms: int = 0

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Execution:
        error = data.get("error")
        return cls(
            results=[
                Result(r["type"], r["data"], bool(r.get("is_main_result")))
                for r in data.get("results", [])
            ],
            stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""),
            error=ExecutionError(error["name"], error["value"], list(error["traceback"]))
            if error
            else None,
            execution_count=data.get("execution_count"),
            duration_ms=int(data.get("duration_ms", 0)),
        )

    def _first(self, mime: str) -> str | None:
        matches = sorted(
            (r for r in self.results if r.type == mime), key=lambda r: not r.is_main_result
        )
        return matches[0].data if matches else None

    @property
    def text(self) -> str | None:
        """The plain-text form of the cell's value (or first output), if any."""
        return self._first("text/plain")

    @property
    def png(self) -> str | None:
        """The first PNG image (base64), e.g. a matplotlib figure."""
        return self._first("image/png")

    @property
    def html(self) -> str | None:
        """The first HTML output, e.g. a pandas table."""
        return self._first("text/html")
