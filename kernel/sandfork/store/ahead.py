"""Chunks fetched ahead of their use, for a snapshot's fetch.

A fetch writes a snapshot's files span by span; each span's chunk came from the bucket only
when the span was reached, one GET at a time, so a 1 GiB snapshot waited on some 300 round
trips in a row. :class:`FetchAhead` knows the order in which the manifest uses its chunks and
keeps the next :data:`WINDOW` of them on their way, on threads (a GET waits on the network,
not on the CPU): at most that many chunks are held ahead of the writing, whatever the
snapshot's size.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from sandfork.store.manifest import ZERO, Entry

WINDOW = 16  # chunks on their way ahead of the one being written (64 MiB at most)
THREADS = 8  # GETs at once

Fetch = Callable[[str], bytes]


class FetchAhead:
    """``fetch`` of the chunks of ``entries``, each started up to :data:`WINDOW` chunks
    before the writing asks for it; a chunk asked for again is fetched again (the caller
    keeps recent ones)."""

    def __init__(self, fetch: Fetch, entries: tuple[Entry, ...]) -> None:
        self._fetch = fetch
        order: dict[str, int] = {}
        for entry in entries:
            for digest, _, _ in entry.spans:
                if digest != ZERO:
                    order.setdefault(digest, len(order))
        self._order = list(order)
        self._position = order
        self._started = 0  # chunks of the order started so far
        self._pending: dict[str, Future[bytes]] = {}
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="fetch-ahead")

    def __call__(self, digest: str) -> bytes:
        position = self._position.get(digest)
        if position is not None:
            while self._started < min(position + WINDOW + 1, len(self._order)):
                ahead = self._order[self._started]
                self._pending[ahead] = self._pool.submit(self._fetch, ahead)
                self._started += 1
        future = self._pending.pop(digest, None)
        return future.result() if future is not None else self._fetch(digest)

    def __enter__(self) -> FetchAhead:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
