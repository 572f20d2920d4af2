"""The console log as the API serves it: whole lines of its tail, and a follower that goes on
from there, starting again when the backend cuts the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfork.engine import console


def test_the_tail_is_whole_lines_and_ends_where_a_line_ends(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"first line\nsecond\nthird, half")
    assert console.tail(log) == (["first line", "second"], len(b"first line\nsecond\n"))
    assert console.tail(log, limit=20)[0] == ["second"]  # "e\n" was the cut end of one
    assert console.tail(tmp_path / "none.log") == ([], 0)


@pytest.mark.asyncio
async def test_a_follower_gets_new_lines_and_starts_again_after_a_cut(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"old\n")
    _, offset = console.tail(log)
    follower = console.follow(log, offset, lambda: True)
    with log.open("ab") as f:
        f.write(b"new one\nand a ha")
    assert await anext(follower) == "new one"
    log.write_bytes(b"[cut]\nafter\n")  # shorter than what was read: its writer cut it
    assert [await anext(follower), await anext(follower)] == ["[cut]", "after"]
    await follower.aclose()


@pytest.mark.asyncio
async def test_a_follower_ends_with_its_sandbox(tmp_path: Path) -> None:
    alive = [True, False]
    follower = console.follow(tmp_path / "console.log", 0, lambda: alive.pop(0))
    assert [line async for line in follower] == []
