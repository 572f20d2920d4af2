"""``explore``: best-of-N over copy-on-write forks.

Each candidate, a shell command or code for the default code context, runs in its own fork
of a sandbox, all at once; a score function rates each outcome; the best-scored fork is kept
and every other fork is killed (``promote`` on the winner makes it replace the sandbox).
The TypeScript SDK's ``explore`` behaves the same way (see docs/sdk-wire-contract.md).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sandfork.client import blocking
from sandfork.sdk.errors import NotFoundError, SandforkError
from sandfork.sdk.models import ExecResult, Execution

__all__ = [
    "CandidateReport",
    "Code",
    "Command",
    "ExploreResult",
    "Forkable",
    "Winner",
    "async_explore",
    "explore",
]


class _Context(Protocol):
    async def async_run_code(
        self, code: str, timeout_seconds: float | None = None
    ) -> Execution: ...


class Forkable(Protocol):
    """What ``explore`` needs of a sandbox (:class:`sandfork.sdk.Sandbox` is one)."""

    @property
    def id(self) -> str: ...

    async def async_fork_tree(
        self, count: int, *, reseed_python: bool = False, metadata: dict[str, str] | None = None
    ) -> Sequence[Any]: ...

    async def async_exec(self, cmd: str, timeout_seconds: float | None = None) -> ExecResult: ...

    async def async_create_code_context(self, isolated: bool = False) -> Any: ...

    async def async_kill(self) -> None: ...


S = TypeVar("S", bound=Forkable)


@dataclass(frozen=True)
class Command:
    """A shell command candidate (a plain ``str`` candidate is one too)."""

    cmd: str
    timeout_seconds: float | None = None


@dataclass(frozen=True)
class Code:
    """A Python code candidate, run in the fork's default code context."""

    code: str
    timeout_seconds: float | None = None


Candidate = str | Command | Code
Outcome = ExecResult | Execution
ScoreFn = Callable[[Any, Any, Any], float | None]
"""``score_fn(outcome, candidate, fork)``: higher wins; ``None``, NaN or raising disqualify.
It runs in a worker thread, so it may call the fork's blocking methods."""


@dataclass
class CandidateReport:
    """How one candidate fared; ``killed`` for every loser (its fork is gone)."""

    index: int
    candidate: Candidate
    sandbox_id: str
    outcome: Outcome | None = None
    score: float | None = None
    error: str | None = None
    killed: bool = False


@dataclass(frozen=True)
class Winner(Generic[S]):
    """The best-scored candidate; its fork, ``sandbox``, is alive."""

    index: int
    candidate: Candidate
    sandbox: S
    outcome: Outcome
    score: float


@dataclass(frozen=True)
class ExploreResult(Generic[S]):
    """The winner, every candidate's report, and why the winner won."""

    winner: Winner[S]
    candidates: list[CandidateReport]
    reason: str


async def _run(fork: Forkable, candidate: Candidate) -> Outcome:
    if isinstance(candidate, str):
        return await fork.async_exec(candidate)
    if isinstance(candidate, Command):
        return await fork.async_exec(candidate.cmd, candidate.timeout_seconds)
    context: _Context = await fork.async_create_code_context()
    return await context.async_run_code(candidate.code, candidate.timeout_seconds)


async def _rate(
    index: int, candidate: Candidate, fork: Forkable, score_fn: ScoreFn
) -> CandidateReport:
    report = CandidateReport(index, candidate, fork.id)
    try:
        report.outcome = await _run(fork, candidate)
        score = await asyncio.to_thread(score_fn, report.outcome, candidate, fork)
    except Exception as e:  # a failed call or scorer disqualifies only its candidate
        report.error = f"{type(e).__name__}: {e}"
        return report
    if isinstance(score, int | float) and not isinstance(score, bool) and not math.isnan(score):
        report.score = float(score)
    else:
        report.error = f"the score function gave {score!r}"
    return report


def pick_winner(reports: Sequence[CandidateReport]) -> CandidateReport | None:
    """The best-scored report (ties: the lowest index), or ``None`` when none was scored."""
    best: CandidateReport | None = None
    for report in reports:
        if report.score is not None and (best is None or report.score > (best.score or 0.0)):
            best = report
    return best


def explain(winner: CandidateReport, reports: Sequence[CandidateReport]) -> str:
    """A sentence saying why ``winner`` won over the others."""
    others = [
        f"#{r.index} (disqualified: {r.error})" if r.score is None else f"#{r.index} ({r.score:g})"
        for r in reports
        if r is not winner
    ]
    beat = f", beating {', '.join(others)}" if others else ", the only candidate"
    return f"candidate #{winner.index} scored {winner.score:g}{beat}"


async def async_explore(
    sandbox: S,
    candidates: Sequence[Candidate],
    score_fn: ScoreFn,
    *,
    metadata: dict[str, str] | None = None,
) -> ExploreResult[S]:
    """Run each candidate in its own fork of ``sandbox``, keep the best-scored fork, kill
    the others. ``sandbox`` runs on untouched; ``result.winner.sandbox.promote()`` makes the
    winner replace it.

    :raises BadRequestError: no candidate, or more than the engine forks at once (16).
    :raises SandforkError: no candidate could be scored (every fork is killed then).
    """
    forks: Sequence[S] = await sandbox.async_fork_tree(len(candidates), metadata=metadata)
    keep: S | None = None
    try:
        reports = await asyncio.gather(
            *(_rate(i, candidates[i], forks[i], score_fn) for i in range(len(forks)))
        )
        best = pick_winner(reports)
        if best is None or best.outcome is None or best.score is None:
            why = "; ".join(f"#{r.index}: {r.error}" for r in reports)
            raise SandforkError(f"explore: no candidate could be scored ({why})")
        keep = forks[best.index]
        for report in reports:
            report.killed = report is not best
        winner = Winner(best.index, best.candidate, keep, best.outcome, best.score)
        return ExploreResult(winner, reports, explain(best, reports))
    finally:
        await asyncio.gather(*(_kill_quietly(fork) for fork in forks if fork is not keep))


async def _kill_quietly(sandbox: Forkable) -> None:
    try:
        await sandbox.async_kill()
    except NotFoundError:
        pass


explore = blocking(async_explore)
