"""``{base_url}sandfork/sandboxes/{id}/ports/{port}/{path}``: a server running in a sandbox,
opened in the browser behind Jupyter's login (jupyter-server-proxy's convention, a URL under
the server's base URL).

Each request, a WebSocket upgrade included, is relayed to the engine's port proxy with the
engine's API key (:mod:`sandfork.http_relay`), and with the browser's ``Host``: a server that
checks a WebSocket's ``Origin`` against it (tornado's do) sees the page's own origin.
Jupyter's own credentials (its login cookies, ``Authorization``, a ``token`` query argument)
are not passed on: guest code must not get the user's Jupyter session. As with
jupyter-server-proxy, requests to the sandbox's server are not XSRF-checked (the server's own
pages could not send Jupyter's token).
"""

from __future__ import annotations

import asyncio
import ssl
from http.cookies import CookieError, SimpleCookie
from urllib.parse import unquote_plus, urlsplit

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import ensure_async
from tornado import web

from sandfork import http_relay
from sandfork.jupyter.errors import http_error
from sandfork.jupyter.handlers import AUTH_RESOURCE
from sandfork.jupyter.service import SandforkService
from sandfork.protocol import SANDBOX_ID, routes

_JUPYTER_COOKIES = ("_xsrf", "username-")  # a name, or the start of one


def _sandbox_cookies(header: str) -> str:
    """The ``Cookie`` header without Jupyter's cookies ("" when none is left)."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return ""
    kept = [
        f"{name}={morsel.coded_value}"
        for name, morsel in jar.items()
        if not any(name == c or (c.endswith("-") and name.startswith(c)) for c in _JUPYTER_COOKIES)
    ]
    return "; ".join(kept)


def _without_token(query: str) -> str:
    """The query string as it came, less Jupyter's ``token`` argument."""
    kept = [part for part in query.split("&") if unquote_plus(part.split("=", 1)[0]) != "token"]
    return "&".join(kept)


class SandboxPortHandler(JupyterHandler):
    """Every method, relayed to the engine's port proxy (:func:`sandfork.protocol.routes.port`)."""

    auth_resource = AUTH_RESOURCE
    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

    @property
    def service(self) -> SandforkService:
        return self.settings["sandfork_service"]  # type: ignore[no-any-return]

    def check_xsrf_cookie(self) -> None:
        """The sandbox's own pages post without Jupyter's XSRF token (see the module)."""

    @web.authenticated
    @authorized
    async def relay(self, sandbox_id: str, port: str, _path: str) -> None:
        allowed = self.authorizer.is_authorized(self, self.current_user, "execute", "kernels")
        if not await ensure_async(allowed):
            raise http_error(403, "not allowed to execute kernels (a sandbox's server is one)")
        connection = await self.service.engine.connection()
        engine = urlsplit(connection.url)
        query = _without_token(self.request.query)
        rest = http_relay.target_after(self.request.path, query, sandbox_id)
        target = routes.API + routes.port(sandbox_id, port, rest)
        body = self.request.body or b""
        add = [("Authorization", f"Bearer {connection.api_key}")]
        prefix = f"{self.base_url}sandfork/sandboxes/{sandbox_id}/ports/{port}"
        add.append(("X-Forwarded-Prefix", prefix))
        if cookies := _sandbox_cookies(self.request.headers.get("Cookie", "")):
            add.append(("Cookie", cookies))
        head = http_relay.request_head(
            self.request.method or "GET",
            target,
            self.request.headers.get_all(),
            len(body),
            drop=("authorization", "cookie", "x-forwarded-prefix"),
            add=add,
        )
        tls = ssl.create_default_context() if engine.scheme == "https" else None
        try:
            reader, writer = await asyncio.open_connection(
                engine.hostname, engine.port or (443 if tls else 80), ssl=tls
            )
        except OSError as e:
            raise http_error(502, f"could not reach the engine at {connection.url}: {e}") from e
        try:
            response = await http_relay.exchange_heads(reader, writer, head, body)
        except (http_relay.RelayFailed, OSError) as e:
            writer.close()
            raise http_error(502, f"the engine did not answer: {e}") from e
        await http_relay.relay(self.detach(), reader, writer, response)

    get = head = post = put = patch = delete = options = relay


PORT_HANDLERS = [
    (rf"/sandfork/sandboxes/({SANDBOX_ID})/ports/([^/]+)/?(.*)", SandboxPortHandler),
]
