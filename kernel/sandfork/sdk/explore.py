"""``explore`` (best-of-N over copy-on-write forks) and ``promote`` (a fork child takes over).

Each candidate, a shell command or code for the default code context, runs in its own fork
of a sandbox, all at once; a score function rates each outcome; the best-scored fork is kept
and every other fork is killed. The TypeScript SDK's ``explore`` behaves the same way (see
docs/sdk-wire-contract.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandfork.sdk.errors import NotFoundError, SandforkError
from sandfork.sdk.models import ExecResult, Execution

if TYPE_CHECKING:
    from sandfork.sdk.sandbox import Sandbox

__all__ = [
    "CandidateReport",
    "Code",
    "Command",
    "ExploreResult",
    "Winner",
    "explore",
    "explore_forks",
    "promote",
    "promote_fork",
]


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
ScoreFn = Callable[[Any, Any, "Sandbox"], float | None]
"""``score_fn(outcome, candidate, fork)``: higher wins; ``None``, NaN or raising disqualify."""


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
class Winner:
    """The best-scored candidate; its fork, ``sandbox``, is alive."""

    index: int
    candidate: Candidate
    sandbox: Sandbox
    outcome: Outcome
    score: float


@dataclass(frozen=True)
class ExploreResult:
    """The winner, every candidate's report, and why the winner won."""

    winner: Winner
    candidates: list[CandidateReport]
    reason: str


def _run(fork: Sandbox, candidate: Candidate) -> Outcome:
    if isinstance(candidate, str):
        return fork.exec(candidate)
    if isinstance(candidate, Command):
        return fork.exec(candidate.cmd, candidate.timeout_seconds)
    return fork.create_code_context().run_code(candidate.code, candidate.timeout_seconds)


def _rate(index: int, candidate: Candidate, fork: Sandbox, score_fn: ScoreFn) -> CandidateReport:
    report = CandidateReport(index, candidate, fork.id)
    try:
        report.outcome = _run(fork, candidate)
        score = score_fn(report.outcome, candidate, fork)
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


def explore(
    sandbox: Sandbox,
    candidates: Sequence[Candidate],
    score_fn: ScoreFn,
    *,
    metadata: dict[str, str] | None = None,
) -> ExploreResult:
    """Run each candidate in its own fork of ``sandbox``, keep the best-scored fork, kill
    the others. ``sandbox`` runs on untouched; ``result.winner.sandbox.promote()`` makes the
    winner replace it.

    :raises BadRequestError: no candidate, or more than the engine forks at once (16).
    :raises SandforkError: no candidate could be scored (every fork is killed then).
    """
    forks = sandbox.fork_tree(len(candidates), metadata=metadata)
    keep: Sandbox | None = None
    try:
        with ThreadPoolExecutor(max_workers=len(forks)) as pool:
            reports = list(
                pool.map(lambda i: _rate(i, candidates[i], forks[i], score_fn), range(len(forks)))
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
        for fork in forks:
            if fork is not keep:
                _kill_quietly(fork)


def promote(
    sandbox: Sandbox, *, kill_parent: bool = True, kill_siblings: bool = False
) -> list[str]:
    """Make a fork child the one that goes on: its parent is killed (unless ``kill_parent``
    is false), its siblings too with ``kill_siblings``; it loses ``fork_parent_id`` and gets
    ``promoted_from``. Returns the ids killed.

    :raises BadRequestError: ``sandbox`` is not a fork child.
    """
    body = {"kill_parent": kill_parent, "kill_siblings": kill_siblings}
    data = sandbox.client.request("POST", f"/sandboxes/{sandbox.id}/promote", json=body)
    sandbox.metadata = dict(data["sandbox"]["metadata"])
    return list(data["killed"])


explore_forks = explore  # the names ``Sandbox``'s methods of the same names call
promote_fork = promote


def _kill_quietly(sandbox: Sandbox) -> None:
    try:
        sandbox.kill()
    except NotFoundError:
        pass
