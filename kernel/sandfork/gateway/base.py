"""What every gateway handler shares: the client key, JSON errors in the engine's shape
(``{"error", "kind"}``), and bodies read only once the key is known to be right.

A request refused before its body is read (a wrong key) is answered once the body is in,
dropped, as the engine does: tornado closes a connection whose request was answered early,
and a client that had sent the body would see a reset instead of the 401.
"""

from __future__ import annotations

import json
from typing import Any

from tornado import web

from sandfork import strict_json
from sandfork.gateway.config import GatewayConfig
from sandfork.gateway.fleet import Engine, Fleet
from sandfork.protocol import (
    AuthError,
    ConflictError,
    EngineUnreachable,
    SandforkError,
    error_for,
    kind_of,
)
from sandfork.serving import key_matches, presented_key

KEY_REQUIRED = "missing or wrong API key (send Authorization: Bearer <key>)"


def failure(message: str, status: int, kind: str | None = None) -> SandforkError:
    """An error answer of ``status`` (its kind: ``kind``, else the status's)."""
    return error_for(status, message, kind)


def no_engine() -> SandforkError:
    """No engine answers the gateway."""
    return EngineUnreachable("no engine answers this gateway (none registered, or all silent)")


def engine_down(what: str, engine: Engine, reason: str) -> SandforkError:
    """A call to ``what`` (a sandbox, a snapshot) of an engine that does not answer: 409."""
    return ConflictError(f"{what} is on {engine.describe()}, which is not answering: {reason}")


@web.stream_request_body
class GatewayHandler(web.RequestHandler):
    """Base of every gateway handler: the client key on every request (override
    :meth:`key_is_right` for the engines' endpoint); a body over ``max_request_bytes`` is
    dropped and refused with a 413 (the relay reads bodies its own way)."""

    _refusal: SandforkError | None = None
    _body: list[bytes]
    _body_size = 0

    @property
    def fleet(self) -> Fleet:
        """The engines and what they own."""
        return self.settings["fleet"]  # type: ignore[no-any-return]

    @property
    def config(self) -> GatewayConfig:
        """The gateway's settings."""
        return self.settings["config"]  # type: ignore[no-any-return]

    def key_is_right(self) -> bool:
        """Whether the request carries the key this endpoint wants (the clients' key)."""
        return key_matches(presented_key(self.request), self.settings["api_key"])

    def prepare(self) -> Any:
        self._body = []
        if not self.key_is_right():
            self.refuse(AuthError(KEY_REQUIRED))

    def refuse(self, error: SandforkError) -> None:
        """Answer ``error`` once the body is in (dropped), whatever the method."""
        self._refusal = error

        async def refused(*_args: str) -> None:
            raise error

        setattr(self, str(self.request.method).lower(), refused)

    @property
    def refused(self) -> bool:
        """True when the request is refused (its body is dropped)."""
        return self._refusal is not None

    def data_received(self, chunk: bytes) -> Any:
        if self._refusal is not None:
            return None
        self._body_size += len(chunk)
        if self._body_size > self.config.max_request_bytes:
            self._body.clear()
            self.refuse(
                failure(
                    "the request body is larger than the gateway's limit of "
                    f"{self.config.max_request_bytes} bytes",
                    413,
                )
            )
            return None
        self._body.append(chunk)
        return None

    def body_bytes(self) -> bytes:
        """The request body (read whole: these endpoints take small JSON)."""
        return b"".join(self._body)

    def json_body(self) -> dict[str, Any]:
        """The request's JSON object (:mod:`sandfork.strict_json`'s rule); 400 otherwise."""
        try:
            return strict_json.parse_object(self.body_bytes())
        except strict_json.JsonRefused as e:
            raise failure(e.message, e.status) from None

    def check_xsrf_cookie(self) -> None:
        """Clients authenticate with a header, not cookies: no XSRF token applies."""

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")

    def write_json(self, data: Any, status: int = 200) -> None:
        """Send ``data`` as the JSON answer."""
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message, kind = str(self._reason), kind_of(status_code)
        if isinstance(exc, SandforkError):
            message, kind = str(exc), exc.kind
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message, "kind": kind.value}))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, SandforkError) and not self._finished:
            if self._headers_written:  # a streamed answer broke off: say so by closing
                self.request.connection.close()  # type: ignore[union-attr]
                return
            self.clear()
            self.send_error(e.status or 500, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)
