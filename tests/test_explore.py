"""``explore`` (best-of-N over forks) and ``promote`` in the Python SDK, on real VMs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandfork.sdk import (
    BadRequestError,
    Client,
    Code,
    Command,
    ExecResult,
    Execution,
    NotFoundError,
    Sandbox,
    SandforkError,
    explore,
)

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]


@pytest.fixture
def base(client: Client) -> Iterator[Sandbox]:
    """A sandbox with a number in a file and a list in its kernel; killed after the test."""
    sandbox = Sandbox.create(client=client)
    try:
        sandbox.filesystem.write("/root/n.txt", "10")
        sandbox.create_code_context().run_code("data = [3, 1, 2]")
        yield sandbox
    finally:
        _kill(sandbox)


def _kill(sandbox: Sandbox | None) -> None:
    if sandbox is None:
        return
    try:
        sandbox.kill()
    except NotFoundError:
        pass


def _alive(client: Client, sandbox_id: str) -> bool:
    try:
        Sandbox.get(sandbox_id, client)
    except NotFoundError:
        return False
    return True


def _number(outcome: ExecResult | Execution, candidate: object, fork: Sandbox) -> float | None:
    assert isinstance(outcome, ExecResult)
    return float(outcome.stdout) if outcome.exit_code == 0 else None


def test_explore_keeps_the_best_fork_and_kills_the_rest(client: Client, base: Sandbox) -> None:
    candidates: list[str | Command] = [
        "expr $(cat /root/n.txt) + 1",  # 11
        Command("expr $(cat /root/n.txt) \\* 3"),  # 30: the best
        "echo broken >&2; exit 1",  # disqualified
    ]
    result = explore(base, candidates, _number)
    winner = result.winner.sandbox
    try:
        assert (result.winner.index, result.winner.score) == (1, 30.0)
        assert result.winner.candidate == candidates[1]
        assert isinstance(result.winner.outcome, ExecResult)
        assert result.winner.outcome.stdout == "30\n"
        assert result.reason.startswith("candidate #1 scored 30, beating #0 (11), #2 (disqualified")
        reports = [(r.index, r.score, r.killed) for r in result.candidates]
        assert reports == [(0, 11.0, True), (1, 30.0, False), (2, None, True)]
        for report in result.candidates:
            assert _alive(client, report.sandbox_id) == (not report.killed)
        assert winner.metadata["fork_parent_id"] == base.id
        assert winner.filesystem.read_text("/root/n.txt") == "10"  # a live copy of the base

        killed = winner.promote()
        assert killed == [base.id]
        assert not _alive(client, base.id)
        assert winner.metadata.get("fork_parent_id") is None
        assert Sandbox.get(winner.id, client).metadata["promoted_from"] == base.id
        with pytest.raises(BadRequestError, match="not a fork child"):
            winner.promote()
    finally:
        _kill(winner)


def test_explore_code_candidates_and_promote_with_siblings(client: Client, base: Sandbox) -> None:
    def sorted_descending(outcome: ExecResult | Execution, candidate: object, _: Sandbox) -> float:
        assert isinstance(outcome, Execution)
        return 1.0 if outcome.text == "[3, 2, 1]" else 0.0

    result = base.explore([Code("sorted(data)"), Code("sorted(data)[::-1]")], sorted_descending)
    winner = result.winner.sandbox
    try:
        assert result.winner.index == 1
        assert not _alive(client, result.candidates[0].sandbox_id)
    finally:
        _kill(winner)

    children = base.fork_tree(2)
    try:
        killed = children[0].promote(kill_parent=False, kill_siblings=True)
        assert killed == [children[1].id]
        assert _alive(client, base.id)
        assert children[0].metadata["promoted_from"] == base.id
    finally:
        for child in children:
            _kill(child)


def test_explore_errors(base: Sandbox) -> None:
    with pytest.raises(BadRequestError, match="count must be"):
        explore(base, [], _number)
    with pytest.raises(SandforkError, match="no candidate could be scored"):
        explore(base, ["exit 1"], _number)
    with pytest.raises(BadRequestError, match="not a fork child"):
        base.promote()
