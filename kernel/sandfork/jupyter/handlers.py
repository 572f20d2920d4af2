"""REST handlers of the server extension under ``{base_url}sandfork/api/`` (see
docs/jupyter-api.md). Each is authenticated and authorized like Jupyter Server's own, and
asks for the rights on the server's other resources (kernels, sessions, contents) that what
it does or shows needs."""

from __future__ import annotations

import json
from typing import Any

from jupyter_client.jsonutil import json_default
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import ensure_async
from tornado import web

from sandfork import strict_json
from sandfork.jupyter.errors import error_message, http_error
from sandfork.jupyter.service import SandforkService
from sandfork.protocol import MAX_ATTACHMENT_BYTES

AUTH_RESOURCE = "sandfork"
MAX_BODY_BYTES = 2**20  # a body without a notebook document
NOTEBOOK_BODY_BYTES = MAX_ATTACHMENT_BYTES + MAX_BODY_BYTES  # one with it (the engine's cap)
MAX_KERNEL_ID = 128  # characters


class SandforkHandler(APIHandler):
    """Base handler: the service, JSON bodies, and errors with the message verbatim."""

    auth_resource = AUTH_RESOURCE
    body_limit = MAX_BODY_BYTES  # bytes of a request body (Jupyter Server has read it whole)

    @property
    def service(self) -> SandforkService:
        return self.settings["sandfork_service"]  # type: ignore[no-any-return]

    def body(self) -> dict[str, Any]:
        """The request's JSON object body (empty allowed), by :mod:`sandfork.strict_json`'s
        rule (the engine's): else a 400, or a 413 past :attr:`body_limit`."""
        try:
            return strict_json.parse_object(
                self.request.body, max_depth=self.service.max_json_depth, max_bytes=self.body_limit
            )
        except strict_json.JsonRefused as e:
            raise http_error(e.status, e.message) from None

    async def require(self, action: str, *resources: str) -> None:
        """403 unless the user may also do ``action`` on each of ``resources``."""
        for resource in resources:
            allowed = self.authorizer.is_authorized(self, self.current_user, action, resource)
            if not await ensure_async(allowed):
                raise http_error(403, f"not allowed to {action} {resource}")

    def reply(self, data: Any, status: int = 200) -> None:
        """Finish with ``data`` as JSON."""
        self.set_status(status)
        self.finish(json.dumps(data, default=json_default))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(error, web.HTTPError):
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"message": error_message(error), "reason": error.reason}))
        else:
            super().write_error(status_code, **kwargs)


class ConfigHandler(SandforkHandler):
    """``GET``: the server's branch limit and the kernelspecs that are Sandfork kernels."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.require("read", "kernelspecs")
        self.reply(self.service.config())


class KernelHandler(SandforkHandler):
    """``GET``: the sandbox behind a Sandfork kernel."""

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        await self.require("read", "kernels")
        self.reply(await self.service.kernel(kernel_id))


class KernelPortsHandler(SandforkHandler):
    """``GET``: the servers listening in a Sandfork kernel's sandbox, each with its URL here."""

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        await self.require("read", "kernels")
        self.reply(await self.service.kernel_ports(kernel_id, self.base_url))


class SnapshotsHandler(SandforkHandler):
    """``GET``: snapshots and their lineage; ``POST``: snapshot a notebook's sandbox."""

    body_limit = NOTEBOOK_BODY_BYTES

    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.require("read", "kernels", "sessions")  # the listing names them
        self.reply(await self.service.lineage())

    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self.require("read", "kernels")  # the snapshot holds the kernel's state
        body = self.body()
        snap = await self.service.snapshot(
            _kernel_id(body), body.get("path"), body.get("notebook"), body.get("name"), _op(body)
        )
        self.reply(snap, 201)


class SnapshotHandler(SandforkHandler):
    """``PATCH {"name"}`` renames a snapshot; ``DELETE`` deletes it."""

    @web.authenticated
    @authorized
    async def patch(self, snapshot_id: str) -> None:
        self.reply(await self.service.rename(snapshot_id, self.body().get("name")))

    @web.authenticated
    @authorized
    async def delete(self, snapshot_id: str) -> None:
        await self.service.delete(snapshot_id)
        self.set_status(204)
        self.finish()


class InventoryHandler(SandforkHandler):
    """``GET``: the variables a snapshot holds, as captured with it."""

    @web.authenticated
    @authorized
    async def get(self, snapshot_id: str) -> None:
        self.reply(await self.service.inventory(snapshot_id))


class DiffHandler(SandforkHandler):
    """``GET``: what changed in the variables from one snapshot to another."""

    @web.authenticated
    @authorized
    async def get(self, before: str, after: str) -> None:
        self.reply(await self.service.diff(before, after))


class RestoreHandler(SandforkHandler):
    """``POST``: restore a snapshot into a new notebook with its own kernel."""

    @web.authenticated
    @authorized
    async def post(self, snapshot_id: str) -> None:
        await self.require("write", "contents", "kernels", "sessions")
        self.reply(await self.service.restore(snapshot_id, _op(self.body())), 201)


class ForksHandler(SandforkHandler):
    """``POST``: fork a notebook's live sandbox into branch notebooks."""

    body_limit = NOTEBOOK_BODY_BYTES

    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self.require("write", "contents", "kernels", "sessions")
        body = self.body()
        result = await self.service.fork(
            _kernel_id(body), body.get("path"), body.get("notebook"), body.get("count"), _op(body)
        )
        self.reply(result, 201)


class OperationHandler(SandforkHandler):
    """``GET``: progress of a long operation."""

    @web.authenticated
    @authorized
    async def get(self, op_id: str) -> None:
        self.reply(self.service.operations.get(op_id).to_api())


def _kernel_id(body: dict[str, Any]) -> str:
    kernel_id = body.get("kernel_id")
    if not isinstance(kernel_id, str) or not kernel_id:
        raise http_error(400, "field 'kernel_id' is required (the notebook's kernel, a string)")
    if len(kernel_id) > MAX_KERNEL_ID:
        raise http_error(400, f"field 'kernel_id' is longer than {MAX_KERNEL_ID} characters")
    return kernel_id


def _op(body: dict[str, Any]) -> str | None:
    op = body.get("operation")
    if op is not None and not isinstance(op, str):
        raise http_error(400, "field 'operation' must be a string")
    return op


HANDLERS: list[tuple[str, type[SandforkHandler]]] = [
    (r"/sandfork/api/config", ConfigHandler),
    (r"/sandfork/api/kernels/([^/]+)", KernelHandler),
    (r"/sandfork/api/kernels/([^/]+)/ports", KernelPortsHandler),
    (r"/sandfork/api/snapshots", SnapshotsHandler),
    (r"/sandfork/api/snapshots/([^/]+)", SnapshotHandler),
    (r"/sandfork/api/snapshots/([^/]+)/restore", RestoreHandler),
    (r"/sandfork/api/snapshots/([^/]+)/inventory", InventoryHandler),
    (r"/sandfork/api/snapshots/([^/]+)/diff/([^/]+)", DiffHandler),
    (r"/sandfork/api/forks", ForksHandler),
    (r"/sandfork/api/operations/([^/]+)", OperationHandler),
]
