"""What every API handler shares: API-key authentication, JSON bodies and JSON errors."""

from __future__ import annotations

import hmac
import json
from typing import Any

from tornado import httputil, web

from sandfork.engine.errors import ApiError, BadRequest
from sandfork.engine.manager import SandboxManager

API_KEY_REQUIRED = "missing or wrong API key (send Authorization: Bearer <key>)"


def has_api_key(request: httputil.HTTPServerRequest, expected: str) -> bool:
    """True when the request carries the engine's API key (``Authorization`` or ``X-API-Key``)."""
    header = request.headers.get("Authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else ""
    token = token or request.headers.get("X-API-Key", "")
    return bool(token) and hmac.compare_digest(token.encode(), expected.encode())


class ApiHandler(web.RequestHandler):
    """Base of every ``/v1`` handler; no endpoint is served without the API key.

    A request from loopback is not trusted either: a guest reaches the host's loopback
    through QEMU's user-mode network.
    """

    @property
    def manager(self) -> SandboxManager:
        return self.settings["manager"]  # type: ignore[no-any-return]

    def prepare(self) -> None:
        if not has_api_key(self.request, self.settings["api_key"]):
            raise ApiError(API_KEY_REQUIRED, 401)

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
        """The request's JSON object; an empty body is an empty object."""
        if not self.request.body:
            return {}
        try:
            body = json.loads(self.request.body)
        except ValueError as e:
            raise BadRequest(f"the request body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body


def field(
    body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None
) -> Any:
    """``body[name]`` checked against ``kind``; a missing field gives ``default``."""
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise BadRequest(f"field {name!r} must be a number, not a boolean")
    if not isinstance(value, kind):
        expected = (
            kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        )
        raise BadRequest(f"field {name!r} must be of type {expected}")
    return value


def timeout_field(body: dict[str, Any], seconds: str, millis: str | None = None) -> float | None:
    """A positive timeout in seconds, given in seconds or (PandaStack's run) in milliseconds."""
    value = field(body, seconds, (int, float))
    if value is None and millis is not None:
        ms = field(body, millis, (int, float))
        value = None if ms is None else ms / 1000
    if value is not None and not 0 < value <= 86400:
        raise BadRequest(f"timeout must be between 0 and 86400 seconds, got {value}")
    return None if value is None else float(value)
