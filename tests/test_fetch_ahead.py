"""Chunks fetched ahead of their use (``store/ahead.py``): several in flight at once, each
handed to its use whatever the order it is asked in, a failure raised where it is used."""

from __future__ import annotations

import threading

import pytest

from sandfork.store.ahead import AHEAD, Ahead

HANG = 60.0  # a bound for a hang, not a speed


class Bucket:
    """A fetch function whose fetches of ``held`` wait until AHEAD fetches have started."""

    def __init__(self, held: str = "", failing: str = "") -> None:
        self.started: list[str] = []
        self.held = held
        self.failing = failing
        self.changed = threading.Condition()

    def __call__(self, digest: str) -> bytes:
        with self.changed:
            self.started.append(digest)
            self.changed.notify_all()
            if digest == self.held:
                assert self.changed.wait_for(lambda: len(self.started) >= AHEAD, HANG)
        if digest == self.failing:
            raise OSError(f"no chunk {digest}")
        return digest.encode()


def test_the_next_chunks_are_in_flight_while_the_first_is_fetched() -> None:
    order = [f"c{i}" for i in range(3 * AHEAD)]
    bucket = Bucket(held="c0")
    with Ahead(bucket, order) as ahead:
        assert [ahead(d) for d in order] == [d.encode() for d in order]
    assert sorted(bucket.started) == sorted(order)  # each fetched once


def test_chunks_asked_out_of_order_or_again_are_fetched_when_asked() -> None:
    order = [f"c{i}" for i in range(2 * AHEAD)]
    bucket = Bucket()
    with Ahead(bucket, order) as ahead:
        assert ahead("c5") == b"c5"
        assert ahead("other") == b"other"
        assert ahead("c5") == b"c5"  # asked again
        assert [ahead(d) for d in order] == [d.encode() for d in order]


def test_a_chunk_that_fails_fails_where_it_is_used() -> None:
    order = [f"c{i}" for i in range(2 * AHEAD)]
    bucket = Bucket(failing="c3")
    with Ahead(bucket, order) as ahead:
        assert [ahead(d) for d in order[:3]] == [b"c0", b"c1", b"c2"]
        with pytest.raises(OSError, match="no chunk c3"):
            ahead("c3")
