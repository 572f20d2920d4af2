"""``GET /v1/sandboxes/{id}/ports`` (the ports a server listens on in the sandbox) and the port
proxy ``/v1/sandboxes/{id}/ports/{port}/{path}``: any request there (HTTP, a streamed or
large response, a WebSocket upgrade) goes to ``/{path}`` of the server on that port, with the
API key like every endpoint; the engine's credentials are not passed on to the sandbox.
"""

from __future__ import annotations

from sandfork import http_relay
from sandfork.engine import ports
from sandfork.engine.handlers.base import ApiHandler

CREDENTIALS = ("authorization", "x-api-key")
"""Request headers the sandbox never sees."""


def port_path(sandbox_id: str, port: int) -> str:
    """Where port ``port`` of a sandbox is served, below the engine's URL."""
    return f"/v1/sandboxes/{sandbox_id}/ports/{port}"


class PortsHandler(ApiHandler):
    """``GET``: ``{"ports": [{"port", "url"}]}``, the listening ports (PandaStack's shape)."""

    async def get(self, sandbox_id: str) -> None:
        found = await ports.list_ports(self.sandboxes, sandbox_id, self.config.agent_timeout)
        listed = [{"port": p, "url": port_path(sandbox_id, p) + "/"} for p in found]
        self.write_json({"ports": listed})


class PortProxyHandler(ApiHandler):
    """Every method: relayed to the sandbox's server on the port; a 502 saying why when
    nothing answers there."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

    def body_limit(self) -> int:
        return int(self.config.max_port_request_bytes)

    async def relay(self, sandbox_id: str, port_text: str, _path: str) -> None:
        port = ports.port_number(port_text)
        body = self.body_bytes()
        forwarded = "X-Forwarded-Prefix" in self.request.headers  # a proxy in front says where
        head = http_relay.request_head(
            self.request.method or "GET",
            http_relay.target_after(self.request.path, self.request.query, sandbox_id),
            self.request.headers.get_all(),
            len(body),
            drop=CREDENTIALS,
            add=[] if forwarded else [("X-Forwarded-Prefix", port_path(sandbox_id, port))],
        )
        stream = await ports.open_port(self.sandboxes, sandbox_id, port)
        try:
            response = await http_relay.exchange_heads(stream, stream, head, body)
        except (http_relay.RelayFailed, OSError) as e:  # exchange_heads maps a short read
            stream.close()
            raise ports.PortRefused(f"sandbox {sandbox_id}, port {port}: {e}") from None
        await http_relay.relay(self.detach(), stream, stream, response)

    get = head = post = put = patch = delete = options = relay
