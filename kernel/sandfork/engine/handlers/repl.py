"""``/v1/sandboxes/{id}/repl/sessions``: code contexts (real ipykernels inside the sandbox)."""

from __future__ import annotations

from sandfork.engine.errors import BadRequest
from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.handlers.validate import field, text_field, timeout_field


class SessionsHandler(ApiHandler):
    """``POST`` returns the default context (or a new isolated one); ``GET`` lists them."""

    async def get(self, sandbox_id: str) -> None:
        self.write_json(await self.execution.contexts(sandbox_id))

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        language = text_field(body, "language", 64, "python") or "python"
        if language.lower() not in ("python", "python3", "py"):
            raise BadRequest(f"unsupported language {language!r}: code contexts run Python")
        isolated = field(body, "isolated", bool, False)
        self.write_json(await self.execution.create_context(sandbox_id, isolated), 201)


class SessionHandler(ApiHandler):
    """``DELETE`` shuts an isolated context down; the default context just stays."""

    async def delete(self, sandbox_id: str, context: str) -> None:
        await self.execution.close_context(sandbox_id, context)
        self.set_status(204)
        self.finish()


class RunHandler(ApiHandler):
    """``POST``: run code in a context; answer with its results, streams and error."""

    async def post(self, sandbox_id: str, context: str) -> None:
        body = self.json_body()
        code = text_field(body, "code", 2**30)
        if code is None:
            raise BadRequest("field 'code' is required")
        timeout = timeout_field(body, "timeout_seconds", millis="timeout_ms")
        request = {**body, "context": context}
        self.write_json(await self.execution.run_code(sandbox_id, context, code, timeout, request))


class InterruptHandler(ApiHandler):
    """``POST``: interrupt the code running in a context (SIGINT to its kernel)."""

    async def post(self, sandbox_id: str, context: str) -> None:
        self.json_body()  # takes none, but a bad or oversized one is refused
        await self.execution.interrupt(sandbox_id, context)
        self.set_status(204)
        self.finish()


class RestartHandler(ApiHandler):
    """``POST``: restart a context's kernel; the context keeps its id, its state is gone."""

    async def post(self, sandbox_id: str, context: str) -> None:
        self.json_body()  # takes none, but a bad or oversized one is refused
        await self.execution.restart(sandbox_id, context)
        self.set_status(204)
        self.finish()
