"""Relaying a WebSocket to the engine that owns its sandbox: a code context's kernel
channels (``…/repl/sessions/{ctx}/channels``) and a server's WebSocket behind the port proxy
(``…/ports/{port}/…``). Any upgrade request under a sandbox is one of these.

The engine's WebSocket is opened before the client's upgrade is accepted, so a refusal (a
sandbox not running, nothing listening on the port) reaches the client as the engine's own
status and JSON error. Then frames are copied both ways as they come, text as text and binary
as binary, and a close on either side closes the other with its code.
"""

from __future__ import annotations

import json
from typing import Any

from tornado import httputil, websocket
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.routing import Matcher

from sandfork.gateway.base import KEY_REQUIRED
from sandfork.gateway.fleet import Fleet
from sandfork.gateway.relay import upstream_headers
from sandfork.gateway.routing import sandbox_in, target
from sandfork.protocol import AuthError, EngineUnreachable, SandforkError, error_for, kind_of
from sandfork.serving import key_matches, presented_key

_WS_ONLY = ("sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions")


class UpgradeUnderSandbox(Matcher):
    """Matches a WebSocket upgrade of any path under a sandbox."""

    def match(self, request: httputil.HTTPServerRequest) -> dict[str, Any] | None:
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        return {} if upgrade and sandbox_in(request.path or "") else None


class WebSocketRelay(websocket.WebSocketHandler):
    """One client's WebSocket, relayed to the engine's."""

    _upstream: websocket.WebSocketClientConnection | None = None
    _early: list[str | bytes]
    _opened = False

    async def prepare(self) -> None:
        """Refuse, before the upgrade, a wrong key or what the engine refuses."""
        self._early = []
        if not key_matches(presented_key(self.request), self.settings["api_key"]):
            self._refuse(AuthError(KEY_REQUIRED))
            return
        fleet: Fleet = self.settings["fleet"]
        try:
            chosen = await target(fleet, "GET", self.request.path)
            engine = chosen.engine
            if engine is None:  # a silent engine's sandbox: nothing to connect to
                raise error_for(409, str((chosen.answer or {}).get("error")))
            headers = upstream_headers(self.request.headers, engine)
            for name in _WS_ONLY:
                headers.pop(name, None)
            protocols = self.request.headers.get("Sec-WebSocket-Protocol")
            headers.pop("Sec-WebSocket-Protocol", None)
            url = engine.url.replace("http", "ws", 1) + self.request.uri
            try:
                self._upstream = await websocket.websocket_connect(
                    HTTPRequest(url, headers=headers, connect_timeout=10.0),
                    on_message_callback=self._from_engine,
                    max_message_size=1 << 30,
                    subprotocols=[p.strip() for p in protocols.split(",")] if protocols else None,
                )
            except HTTPClientError as e:
                if e.code == 599 or e.response is None:
                    fleet.unreachable(engine, e)
                    raise EngineUnreachable(f"{engine.describe()} did not answer: {e}") from e
                self._relay_refusal(e.code, e.response.body)
                return
            except OSError as e:
                fleet.unreachable(engine, e)
                raise EngineUnreachable(f"{engine.describe()} did not answer: {e}") from e
        except SandforkError as e:
            self._refuse(e)

    def _refuse(self, error: SandforkError) -> None:
        self._relay_refusal(
            error.status or 500, json.dumps({"error": str(error), "kind": error.kind.value})
        )

    def _relay_refusal(self, status: int, body: bytes | str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        if not body:
            body = json.dumps({"error": f"HTTP {status}", "kind": kind_of(status).value})
        self.finish(body)

    def check_origin(self, origin: str) -> bool:
        """Clients authenticate with a key in a header, never a cookie: any origin."""
        return True

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        """The subprotocol the engine (the server behind it) chose."""
        return self._upstream.selected_subprotocol if self._upstream is not None else None

    def open(self, *_args: str) -> None:
        self._opened = True
        for message in self._early:
            self._send(message)
        self._early.clear()

    def _from_engine(self, message: str | bytes | None) -> None:
        if message is None:
            upstream = self._upstream
            self.close(
                upstream.close_code if upstream else None,
                upstream.close_reason if upstream else None,
            )
        elif self._opened:
            self._send(message)
        else:
            self._early.append(message)

    def _send(self, message: str | bytes) -> None:
        try:
            self.write_message(message, binary=isinstance(message, bytes))
        except websocket.WebSocketClosedError:
            pass

    async def on_message(self, message: str | bytes) -> None:
        if self._upstream is not None:
            try:
                await self._upstream.write_message(message, binary=isinstance(message, bytes))
            except websocket.WebSocketClosedError:
                self.close()

    def on_close(self) -> None:
        if self._upstream is not None:
            self._upstream.close(self.close_code, self.close_reason)
