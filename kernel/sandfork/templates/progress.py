"""Visible build progress: one line per step with a spinner, the step's latest output line
and its elapsed time, then a ✓/✗ summary line. Safe to use from several threads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["BuildProgress", "Step"]


class Step:
    """Handle of a running step: ``update`` shows a detail, ``done`` sets the summary."""

    def __init__(self, owner: BuildProgress | None, task: TaskID | None, title: str) -> None:
        self._owner = owner
        self._task = task
        self.title = title
        self.summary = ""
        self.started = time.monotonic()

    def update(self, detail: str) -> None:
        """Show ``detail`` (e.g. the latest line of a command's output) next to the step."""
        if self._owner is not None and self._task is not None:
            self._owner._update(self._task, detail)

    def done(self, summary: str) -> None:
        """The text shown after the ✓ when the step finishes."""
        self.summary = summary

    @property
    def elapsed(self) -> float:
        """Seconds since the step started."""
        return time.monotonic() - self.started


class BuildProgress:
    """Shows steps on stderr with rich when ``enabled``; does nothing otherwise.

    Use as a context manager around the whole build, and ``step(title)`` around each step.
    """

    def __init__(self, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None

    def __enter__(self) -> BuildProgress:
        if self.enabled:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TextColumn("[dim]{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _update(self, task: TaskID, detail: str) -> None:
        if self._progress is not None:
            detail = detail if len(detail) <= 70 else detail[:67] + "..."
            self._progress.update(task, detail=escape(detail))

    def note(self, text: str) -> None:
        """Print one line (e.g. "template is cached")."""
        if self.enabled:
            self.console.print(text, highlight=False)

    @contextmanager
    def step(self, title: str) -> Iterator[Step]:
        """Run one step: spinner while inside the block, ✓ or ✗ line at the end."""
        task = None
        if self._progress is not None:
            task = self._progress.add_task(escape(title), detail="")
        handle = Step(self, task, title)
        ok = False
        try:
            yield handle
            ok = True
        finally:
            if self._progress is not None and task is not None:
                self._progress.remove_task(task)
            if self.enabled:
                mark = "[green]✓[/]" if ok else "[red]✗[/]"
                summary = f": {escape(handle.summary)}" if handle.summary and ok else ""
                self.console.print(
                    f"{mark} {escape(title)}{summary} [dim]({handle.elapsed:.1f} s)[/]",
                    highlight=False,
                )
