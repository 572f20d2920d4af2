"""A snapshot's fetch gets its chunks ahead of their use, several at once, a bounded number
ahead (sandfork.store.ahead): the bucket's round trips overlap instead of adding up."""

from __future__ import annotations

import threading

from sandfork.store.ahead import THREADS, WINDOW, FetchAhead
from sandfork.store.manifest import ZERO, Entry


def _file(name: str, digests: list[str]) -> Entry:
    return Entry(name, "file", 0o600, 4 * len(digests), tuple((d, 0, 4) for d in digests))


def test_chunks_come_in_the_manifests_order_each_once_and_a_bounded_number_ahead() -> None:
    digests = [f"{i:064x}" for i in range(1, 3 * WINDOW)]
    entries = (_file("a", [*digests[:WINDOW], ZERO]), _file("b", digests[WINDOW:]))
    started: list[str] = []
    lock = threading.Lock()

    def fetch(digest: str) -> bytes:
        with lock:
            started.append(digest)
        return digest.encode()

    with FetchAhead(fetch, entries) as ahead:
        for used, digest in enumerate(digests):
            assert ahead(digest) == digest.encode()
            with lock:
                assert len(started) <= used + WINDOW + 1, "fetched too far ahead"
    assert sorted(started) == sorted(digests) and len(started) == len(digests)
    assert ZERO not in started


def test_gets_overlap() -> None:
    digests = [f"{i:064x}" for i in range(1, THREADS + 1)]
    together = threading.Barrier(THREADS, timeout=60)  # a hang's bound: every GET waits

    def fetch(digest: str) -> bytes:
        together.wait()  # passes only when THREADS fetches are in flight at once
        return digest.encode()

    with FetchAhead(fetch, (_file("a", digests),)) as ahead:
        assert [ahead(d) for d in digests] == [d.encode() for d in digests]


def test_an_error_reaches_the_writing_and_nothing_is_left_running() -> None:
    digests = [f"{i:064x}" for i in range(1, 5)]

    def fetch(digest: str) -> bytes:
        if digest == digests[2]:
            raise OSError("the bucket went away")
        return b"x"

    ahead = FetchAhead(fetch, (_file("a", digests),))
    try:
        with ahead:
            for digest in digests:
                ahead(digest)
    except OSError as e:
        assert "went away" in str(e)
    else:
        raise AssertionError("the error was lost")
    assert not [t for t in threading.enumerate() if t.name.startswith("fetch-ahead")]
