"""What every API handler shares: API-key authentication, bounded JSON bodies, JSON errors
(``{"error": message, "kind": kind}``, the kind a :class:`~sandfork.protocol.ErrorKind`).

Request bodies are streamed (``stream_request_body``) so that their size is checked before
they are read: a ``Content-Length`` over the route's limit is refused with a JSON 413 right
away when the body is too large to be worth reading; a smaller one (or a chunked body that
goes over the limit) is read and dropped chunk by chunk, then refused by :meth:`body_bytes`
and :meth:`json_body`, so a client still sending gets the 413 instead of a reset connection.
Nothing over the limit is ever kept in memory; a method that takes no body ignores it.

A request refused before its body is read (a wrong API key, no such endpoint) is answered
the same way, once the body is in, dropped: tornado closes a connection whose request was
answered before its body was read, without saying so, and a client that had sent the body
or reused the connection got a reset instead of the 401. Only a body too large to drain is
refused at once, with ``Connection: close``.

A body must keep coming (:class:`_BodyClock`): it may take ``body_timeout`` seconds plus one
second for every ``body_min_rate`` bytes received; a slower one is answered 408 and its
connection closed, so a client trickling a body cannot hold a connection for ever.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tornado import httputil, web
from tornado.ioloop import IOLoop

from sandfork import strict_json
from sandfork.engine.config import EngineConfig
from sandfork.engine.errors import ApiError, BadRequest, TooLarge, kind_of_status
from sandfork.engine.execution import ExecutionService
from sandfork.engine.handlers.validate import field, timeout_field
from sandfork.engine.sandboxes import SandboxService
from sandfork.engine.snapshots import SnapshotService
from sandfork.protocol import ErrorKind
from sandfork.serving import key_matches, presented_key

__all__ = [
    "API_KEY_REQUIRED",
    "ApiHandler",
    "EngineAccess",
    "error_answer",
    "field",
    "has_api_key",
    "timeout_field",
]

API_KEY_REQUIRED = "missing or wrong API key (send Authorization: Bearer <key>)"

# A body declared larger than the limit is still read (and dropped) up to this size, so that
# the client sees the 413; past it the connection is closed right after the 413.
_DRAIN_LIMIT = 256 * 2**20


def error_answer(message: str, kind: ErrorKind) -> dict[str, str]:
    """The body of a failure answer (or of a stream's ``error`` event)."""
    return {"error": message, "kind": kind.value}


def has_api_key(request: httputil.HTTPServerRequest, expected: str) -> bool:
    """True when the request carries the engine's API key (``Authorization`` or ``X-API-Key``)."""
    return key_matches(presented_key(request), expected)


class _BodyClock:
    """The minimum rate of one request body: ``late`` is called once the body has taken
    longer than ``slack`` seconds plus one second per ``rate`` bytes received."""

    def __init__(self, late: Callable[[], None], slack: float, rate: int) -> None:
        self._late = late
        self._slack = slack
        self._rate = rate
        self._loop = IOLoop.current()
        self._start = self._loop.time()
        self._received = 0
        self._timer: object | None = self._loop.call_at(self._deadline(), self._check)

    def received(self, size: int) -> None:
        """``size`` more bytes came (the deadline moves; the timer is re-armed when due)."""
        self._received += size

    def stop(self) -> None:
        """The body is in, or the connection gone."""
        if self._timer is not None:
            self._loop.remove_timeout(self._timer)
            self._timer = None

    def _deadline(self) -> float:
        return self._start + self._slack + self._received / self._rate

    def _check(self) -> None:
        self._timer = None
        if self._loop.time() < self._deadline():
            self._timer = self._loop.call_at(self._deadline(), self._check)
        else:
            self._late()


class EngineAccess:
    """The engine's services, as every handler (HTTP or WebSocket) reaches them."""

    settings: dict[str, Any]

    @property
    def sandboxes(self) -> SandboxService:
        """Create, restore, lease and kill sandboxes."""
        return self.settings["services"].sandboxes  # type: ignore[no-any-return]

    @property
    def execution(self) -> ExecutionService:
        """Commands, files and code contexts inside a sandbox."""
        return self.settings["services"].execution  # type: ignore[no-any-return]

    @property
    def snapshots(self) -> SnapshotService:
        """Snapshots, forks, checkpoints, export and import."""
        return self.settings["services"].snapshots  # type: ignore[no-any-return]


@web.stream_request_body
class ApiHandler(EngineAccess, web.RequestHandler):
    """Base of every ``/v1`` handler; no endpoint is served without the API key.

    A request from loopback is not trusted either: a guest reaches the host's loopback
    through QEMU's user-mode network.
    """

    _body_parts: list[bytes]
    _body_size = 0
    _body_limit = 0
    _body_refusal: str | None = None
    _refusal: ApiError | None = None  # decided before the body: answered once it is in
    _declared = 0  # the Content-Length
    _clock: _BodyClock | None = None
    _closing = False  # answered before the body is in: tornado closes the connection

    @property
    def config(self) -> EngineConfig:
        """The engine's configuration (its limits)."""
        return self.settings["config"]  # type: ignore[no-any-return]

    @property
    def refused(self) -> bool:
        """True when the request is refused (its body is drained and dropped)."""
        return self._refusal is not None

    def body_limit(self) -> int:
        """The largest request body this route takes, in bytes (override per route)."""
        return int(self.config.max_request_bytes)

    def _reads_own_body(self) -> bool:
        """A handler with its own ``body_chunk`` (an import) bounds its body itself."""
        return type(self).body_chunk is not ApiHandler.body_chunk

    def prepare(self) -> None:
        self._body_parts = []
        self._answer_once_the_body_is_in()
        self._declared = self._declared_length()
        if self._declared or "Transfer-Encoding" in self.request.headers:
            self._clock = _BodyClock(
                self._too_slow, self.config.body_timeout, self.config.body_min_rate
            )
        try:
            self.check_request()
        except ApiError as e:
            if self._declared > _DRAIN_LIMIT:
                self._closing = True
                raise
            self._refusal = e

    def check_request(self) -> None:
        """The checks made before the body is read (override to add some): the API key, and
        a declared body size within the route's limit. An :class:`ApiError` raised here is
        the answer, sent once the body is in (dropped)."""
        if not has_api_key(self.request, self.settings["api_key"]):
            raise ApiError(API_KEY_REQUIRED, 401)
        if self._reads_own_body():
            return
        self._body_limit = self.body_limit()
        if self._declared > self._body_limit:
            self._body_refusal = self._too_large_message()
            if self._declared > _DRAIN_LIMIT:
                raise TooLarge(self._body_refusal)

    def _declared_length(self) -> int:
        """The ``Content-Length`` (0 when there is none); a 400 at once, with ``Connection:
        close``, when it is no number (no body can then be drained)."""
        declared = self.request.headers.get("Content-Length")
        if declared is None:
            return 0
        try:
            return int(declared)
        except ValueError:
            self._closing = True
            raise BadRequest(f"bad Content-Length header {declared[:40]!r}") from None

    def _answer_once_the_body_is_in(self) -> None:
        """tornado calls the request's method once the body has been read: for this
        request, that call first stops the body's clock and answers a refusal instead."""
        name = str(self.request.method).lower()
        method = getattr(self, name)

        async def once_the_body_is_in(*args: str, **kwargs: str) -> None:
            if self._clock is not None:
                self._clock.stop()
            if self._refusal is not None:
                raise self._refusal
            result = method(*args, **kwargs)
            if result is not None:
                await result

        setattr(self, name, once_the_body_is_in)

    def _too_slow(self) -> None:
        """The body came slower than the minimum rate: a 408, and the connection closes
        (tornado closes one answered before its body was read)."""
        if self._finished:
            return
        message = (
            f"the request body came slower than {self.config.body_min_rate} bytes per second "
            f"(after {self.config.body_timeout:g} s): the connection is closed"
        )
        self._closing = True
        error = ApiError(message, 408)
        self.send_error(408, exc_info=(ApiError, error, None))

    def on_connection_close(self) -> None:
        if self._clock is not None:
            self._clock.stop()
        super().on_connection_close()

    def on_finish(self) -> None:
        if self._clock is not None:
            self._clock.stop()

    def _too_large_message(self) -> str:
        return f"the request body is larger than this endpoint's limit of {self._body_limit} bytes"

    def data_received(self, chunk: bytes) -> None:
        if self._clock is not None:
            self._clock.received(len(chunk))
        if self._refusal is None:
            self.body_chunk(chunk)

    def body_chunk(self, chunk: bytes) -> None:
        """Keep ``chunk`` of the body, or drop it once the body is over the route's limit
        (override to read the body some other way)."""
        self._body_size += len(chunk)
        if self._body_refusal is None and self._body_size > self._body_limit:
            self._body_refusal = self._too_large_message()
        if self._body_refusal is not None:
            self._body_parts.clear()
            return
        self._body_parts.append(chunk)

    def body_bytes(self) -> bytes:
        """The request body; a 413 when it was over the route's limit."""
        if self._body_refusal is not None:
            raise TooLarge(self._body_refusal)
        return b"".join(self._body_parts)

    def check_xsrf_cookie(self) -> None:
        """API clients authenticate with a header, not cookies: no XSRF token applies."""

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")

    def write_json(self, data: Any, status: int = 200) -> None:
        """Send ``data`` as the JSON response."""
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        kind = kind_of_status(status_code)
        if isinstance(exc, ApiError):
            message, kind = exc.message, exc.kind
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        else:
            message = self._reason
        self.set_header("Content-Type", "application/json")
        if self._closing:  # tornado does not say so itself
            self.set_header("Connection", "close")
        self.finish(json.dumps(error_answer(message, kind)))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, ApiError):
            self.send_error(e.status, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)

    def json_body(self) -> dict[str, Any]:
        """The request's JSON object; an empty body is an empty object.

        Parsed by :mod:`sandfork.strict_json`'s rule, refused with a 400 naming what is
        wrong: anything but one JSON object, ``NaN``/``Infinity``, a key twice in one object,
        nesting deeper than ``max_json_depth``.
        """
        try:
            return strict_json.parse_object(
                self.body_bytes(), max_depth=int(self.config.max_json_depth)
            )
        except strict_json.JsonRefused as e:
            raise ApiError(e.message, e.status) from None
