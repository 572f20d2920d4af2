"""Chunks fetched a few at a time ahead of their use (:class:`Ahead`), for a fetch that
writes a snapshot's files in order: one chunk after another, each a round trip to the
bucket, was most of the time a fetch took where the chunks are small or the files many."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

AHEAD = 8  # chunks in flight: 32 MiB at most in memory


class Ahead:
    """A fetch function that, called with the digests in ``order`` (their first uses, in
    order), has the next :data:`AHEAD` fetched by ``fetch`` meanwhile; any other digest is
    fetched when asked. Use it in a ``with`` block: what is still in flight at its end is
    dropped."""

    def __init__(self, fetch: Callable[[str], bytes], order: Iterable[str]) -> None:
        self._fetch = fetch
        self._order = list(dict.fromkeys(order))
        self._next = 0
        self._flying: dict[str, Future[bytes]] = {}
        self._pool = ThreadPoolExecutor(AHEAD, thread_name_prefix="sandfork-fetch")

    def __call__(self, digest: str) -> bytes:
        """The chunk ``digest``."""
        self._top_up()
        flying = self._flying.pop(digest, None)
        if flying is None:  # out of order, or asked again
            return self._fetch(digest)
        self._top_up()
        return flying.result()

    def _top_up(self) -> None:
        while len(self._flying) < AHEAD and self._next < len(self._order):
            digest = self._order[self._next]
            self._next += 1
            self._flying[digest] = self._pool.submit(self._fetch, digest)

    def __enter__(self) -> Ahead:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
