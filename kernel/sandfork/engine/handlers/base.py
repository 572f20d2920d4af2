"""What every API handler shares: API-key authentication, bounded JSON bodies, JSON errors.

Request bodies are streamed (``stream_request_body``) so that their size is checked before
they are read: a ``Content-Length`` over the route's limit is refused with a JSON 413 right
away when the body is too large to be worth reading; a smaller one (or a chunked body that
goes over the limit) is read and dropped chunk by chunk, then refused by :meth:`body_bytes`
and :meth:`json_body`, so a client still sending gets the 413 instead of a reset connection.
Nothing over the limit is ever kept in memory; a method that takes no body ignores it.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from tornado import httputil, web

from sandfork.engine.config import EngineConfig
from sandfork.engine.errors import ApiError, BadRequest, TooLarge
from sandfork.engine.execution import ExecutionService
from sandfork.engine.handlers.validate import check_depth, field, timeout_field
from sandfork.engine.sandboxes import SandboxService
from sandfork.engine.snapshotting import SnapshotService

__all__ = [
    "API_KEY_REQUIRED",
    "ApiHandler",
    "EngineAccess",
    "field",
    "has_api_key",
    "timeout_field",
]

API_KEY_REQUIRED = "missing or wrong API key (send Authorization: Bearer <key>)"

# A body declared larger than the limit is still read (and dropped) up to this size, so that
# the client sees the 413; past it the connection is closed right after the 413.
_DRAIN_LIMIT = 256 * 2**20


def has_api_key(request: httputil.HTTPServerRequest, expected: str) -> bool:
    """True when the request carries the engine's API key (``Authorization`` or ``X-API-Key``)."""
    header = request.headers.get("Authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else ""
    token = token or request.headers.get("X-API-Key", "")
    return bool(token) and hmac.compare_digest(token.encode(), expected.encode())


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


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

    @property
    def config(self) -> EngineConfig:
        """The engine's configuration (its limits)."""
        return self.settings["config"]  # type: ignore[no-any-return]

    def body_limit(self) -> int:
        """The largest request body this route takes, in bytes (override per route)."""
        return int(self.config.max_request_bytes)

    def _reads_own_body(self) -> bool:
        """A handler with its own ``data_received`` (an import) bounds its body itself."""
        return type(self).data_received is not ApiHandler.data_received

    def prepare(self) -> None:
        if not has_api_key(self.request, self.settings["api_key"]):
            raise ApiError(API_KEY_REQUIRED, 401)
        self._body_parts = []
        if self._reads_own_body():
            return
        self._body_limit = self.body_limit()
        declared = self.request.headers.get("Content-Length")
        if declared is None:
            return
        try:
            length = int(declared)
        except ValueError:
            raise BadRequest(f"bad Content-Length header {declared[:40]!r}") from None
        if length > self._body_limit:
            self._body_refusal = self._too_large_message()
            if length > _DRAIN_LIMIT:
                raise TooLarge(self._body_refusal)

    def _too_large_message(self) -> str:
        return f"the request body is larger than this endpoint's limit of {self._body_limit} bytes"

    def data_received(self, chunk: bytes) -> None:
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
        if isinstance(exc, ApiError):
            message = exc.message
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        else:
            message = self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, ApiError):
            self.send_error(e.status, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)

    def json_body(self) -> dict[str, Any]:
        """The request's JSON object; an empty body is an empty object.

        Refused with a 400: anything but one JSON object, ``NaN``/``Infinity``, and nesting
        deeper than ``max_json_depth`` (Python's parser recurses: very deep input is caught
        as the ``RecursionError`` it raises, not left to become a 500).
        """
        raw = self.body_bytes()
        if not raw.strip():
            return {}
        depth = int(self.config.max_json_depth)
        try:
            body = json.loads(raw, parse_constant=_reject_constant)
        except RecursionError:
            raise BadRequest(f"the request body nests deeper than {depth} levels") from None
        except ValueError as e:
            raise BadRequest(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        check_depth(body, depth)
        return body
