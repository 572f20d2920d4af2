"""The synchronous facade of :class:`~sandfork.client.engine_client.EngineClient`, and
:func:`blocking`, which makes the SDK's blocking methods from its asynchronous ones.

Like nbclient's ``run_sync``, each call runs the client's coroutine to completion; here on
one event loop in a daemon thread of its own, shared by the process (started on first use), so
a call works the same from plain code, from inside a running event loop (a Jupyter kernel, a
notebook cell) and from many threads at once. Code that has a loop of its own awaits the
asynchronous methods instead and never starts that thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import queue
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

from sandfork.client.engine_client import EngineClient, Response

T = TypeVar("T")
P = ParamSpec("P")
C = TypeVar("C", bound="SyncEngineClient")

_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_lock = threading.Lock()
_END = object()
# Under a blocking call, the queue through which the caller's thread runs the user's callbacks.
_caller_calls: contextvars.ContextVar[queue.SimpleQueue[Any] | None] = contextvars.ContextVar(
    "sandfork_caller_calls", default=None
)


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="sandfork-client", daemon=True)
            thread.start()
            _loop, _thread = loop, thread
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the client's event loop thread and return its result (or raise its
    exception); safe inside a running event loop and from any thread but that loop's own.

    While it waits, the calling thread runs the callbacks :func:`on_caller` handed over, so
    a callback may itself call the blocking SDK.
    """
    loop = _background_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("run_sync called on the client's own event loop: await instead")
    calls: queue.SimpleQueue[Any] = queue.SimpleQueue()

    async def run() -> T:
        _caller_calls.set(calls)
        return await coro

    future = asyncio.run_coroutine_threadsafe(run(), loop)
    future.add_done_callback(lambda _: calls.put(_END))
    try:
        while (call := calls.get()) is not _END:
            call()
    except BaseException:
        future.cancel()  # a callback failed (or the caller was interrupted): the call stops
        raise
    return future.result()


def on_caller(callback: Callable[P, None] | None) -> Callable[P, None] | None:
    """``callback`` as the SDK should call it from a coroutine: under a blocking call, queued
    to run on the caller's thread (in order); under ``await``, as it is."""
    calls = _caller_calls.get()
    if callback is None or calls is None:
        return callback
    function = callback

    def hand_over(*args: P.args, **kwargs: P.kwargs) -> None:
        calls.put(functools.partial(function, *args, **kwargs))

    return hand_over


def blocking(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The blocking version of an asynchronous function or method (nbclient's
    ``execute = run_sync(async_execute)``): ``exec = blocking(async_exec)``; for a classmethod,
    ``create = classmethod(blocking(async_create))``."""
    function: Callable[..., Coroutine[Any, Any, T]] = cast(
        Any, method.__func__ if isinstance(method, classmethod) else method
    )

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return run_sync(function(*args, **kwargs))

    run.__doc__ = f"{function.__doc__ or ''}\n\n(Blocking; ``{function.__name__}`` awaits.)"
    return run


class SyncEngineClient:
    """A blocking client of one engine: :class:`EngineClient`'s calls, run to completion.

    ``url`` and ``api_key`` name the engine; without them it is found (and a local one
    started) right away, like :func:`sandfork.client.connection.resolve` does. ``aio`` is the
    asynchronous client underneath, for code running in an event loop; :meth:`wrapping` makes
    a facade of one without finding anything now.
    """

    def __init__(
        self, url: str | None = None, api_key: str | None = None, timeout: float = 600.0
    ) -> None:
        self.aio = EngineClient(url, api_key, timeout)
        self.aio.resolve_now()

    @classmethod
    def wrapping(cls: type[C], aio: EngineClient) -> C:
        """The facade of the asynchronous client ``aio`` (the engine is found when first
        used, on the caller's loop)."""
        client = cls.__new__(cls)
        client.aio = aio
        return client

    @property
    def url(self) -> str:
        """The engine's URL."""
        return self.aio.resolve_now().url

    @property
    def api_key(self) -> str:
        """The engine's API key."""
        return self.aio.resolve_now().api_key

    @property
    def timeout(self) -> float:
        """Seconds a request may take (streams aside)."""
        return self.aio.timeout

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request to ``/v1{path}``; return the decoded JSON (``None`` for 204).

        Keywords: ``params``, ``json``, ``data`` (bytes, text or a binary file), ``headers``,
        ``timeout``.
        """
        return run_sync(self.aio.request(method, path, **kwargs))

    def raw(self, method: str, path: str, **kwargs: Any) -> Response:
        """Send a request and return the whole response, raising the error for a failure."""
        return run_sync(self.aio.fetch(method, path, **kwargs))

    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[bytes]:
        """Send a request and yield the answer's body in chunks as they arrive."""
        chunks: queue.SimpleQueue[Any] = queue.SimpleQueue()

        async def fetch() -> None:
            try:
                await self.aio.fetch(method, path, streaming_callback=chunks.put, **kwargs)
            except BaseException as e:
                chunks.put(e)
                raise
            chunks.put(_END)

        future = asyncio.run_coroutine_threadsafe(fetch(), _background_loop())
        try:
            while (chunk := chunks.get()) is not _END:
                if isinstance(chunk, BaseException):
                    raise chunk
                yield chunk
        finally:
            future.cancel()

    def lines(self, method: str, path: str, **kwargs: Any) -> Iterator[str]:
        """Send a request and yield the answer's lines (UTF-8, without line ends) as they
        arrive; for server-sent events."""
        pending = b""
        for chunk in self.stream(method, path, **kwargs):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")

    def download(self, path: str, dest: str | Path) -> None:
        """Write the body of ``GET /v1{path}`` to the file ``dest`` as it arrives."""
        with Path(dest).open("wb") as f:
            run_sync(self.aio.fetch("GET", path, streaming_callback=f.write))
