"""``/v1/sandboxes/{id}/fs``: read, write, list, stat and delete files in a sandbox."""

from __future__ import annotations

from sandfork.engine.errors import BadRequest
from sandfork.engine.handlers.base import ApiHandler


class _FsHandler(ApiHandler):
    def path_arg(self) -> str:
        path = self.get_query_argument("path", "")
        if not path.startswith("/"):
            raise BadRequest("query parameter 'path' must be an absolute path in the sandbox")
        if "\x00" in path:
            raise BadRequest("path must not contain NUL bytes")
        return path


class FileHandler(_FsHandler):
    """``GET`` reads a file (raw bytes), ``PUT`` writes the body to it, ``DELETE`` removes it."""

    async def get(self, sandbox_id: str) -> None:
        data = await self.manager.read_file(sandbox_id, self.path_arg())
        self.set_header("Content-Type", "application/octet-stream")
        self.finish(data)

    async def put(self, sandbox_id: str) -> None:
        result = await self.manager.write_file(sandbox_id, self.path_arg(), self.request.body)
        self.write_json(result)

    async def delete(self, sandbox_id: str) -> None:
        recursive = self.get_query_argument("recursive", "false") == "true"
        await self.manager.call(
            sandbox_id, "fs.delete", {"path": self.path_arg(), "recursive": recursive}
        )
        self.set_status(204)
        self.finish()


class DirHandler(_FsHandler):
    """``GET`` lists a directory."""

    async def get(self, sandbox_id: str) -> None:
        self.write_json(await self.manager.call(sandbox_id, "fs.list", {"path": self.path_arg()}))


class StatHandler(_FsHandler):
    """``GET`` describes one path."""

    async def get(self, sandbox_id: str) -> None:
        self.write_json(await self.manager.call(sandbox_id, "fs.stat", {"path": self.path_arg()}))
