"""The engine's HTTP server: tornado's, with a header timeout apart from the idle timeout.

tornado bounds the wait for a request's headers with one number, ``idle_connection_timeout``
(``header_timeout`` of its connections): it counts from the moment the server waits for the
next request, so the idle time of a kept-alive connection and the reading of the next
headers are one span. A short value would close idle keep-alive connections early; a long
one lets a client that sends its headers a byte at a time hold a connection that long. So a
connection's first request (the client has just connected: nothing is idle) gets the short
``header_timeout``, and each later one ``idle_timeout`` for its wait and headers together.
Bodies are bounded by the handlers (a minimum rate, :mod:`sandfork.engine.handlers.base`).
"""

from __future__ import annotations

import copy
from typing import Any

from tornado import httputil
from tornado.http1connection import HTTP1Connection
from tornado.httpserver import HTTPServer


class EngineHTTPServer(HTTPServer):
    """An ``HTTPServer`` whose connections get ``header_timeout`` for their first request's
    headers and ``idle_connection_timeout`` between requests."""

    def initialize(self, *args: Any, header_timeout: float | None = None, **kwargs: Any) -> None:
        super().initialize(*args, **kwargs)
        self.header_timeout = header_timeout or self.conn_params.header_timeout
        self._served: set[object] = set()  # connections that have had a request

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        if server_conn not in self._served and isinstance(request_conn, HTTP1Connection):
            self._served.add(server_conn)
            params = copy.copy(request_conn.params)
            params.header_timeout = self.header_timeout
            request_conn.params = params
        return super().start_request(server_conn, request_conn)

    def on_close(self, server_conn: object) -> None:
        self._served.discard(server_conn)
        super().on_close(server_conn)
