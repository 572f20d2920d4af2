"""``/v1/sandboxes/{id}/fs``: read, write, list, stat and delete files in a sandbox.

Reads and writes are bounded by ``max_file_bytes``: a larger upload is a 413, and so is a
read of a larger file, which can be read in ranges instead (``offset``, ``length``). Only
ranged reads work on what is not a regular file (``/dev/urandom``, say).
"""

from __future__ import annotations

from sandfork.engine.errors import BadRequest
from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.handlers.validate import MAX_PATH_CHARS, check_text, int_argument


class _FsHandler(ApiHandler):
    def path_arg(self) -> str:
        # Decoded by hand: tornado's getters turn control characters (a NUL too) into spaces,
        # which would silently name another file.
        raw = self.request.query_arguments.get("path") or [b""]
        path = self.decode_argument(raw[-1], name="path")
        if not path.startswith("/"):
            raise BadRequest("query parameter 'path' must be an absolute path in the sandbox")
        return check_text(path, "query parameter 'path'", MAX_PATH_CHARS)


class FileHandler(_FsHandler):
    """``GET`` reads a file (raw bytes), ``PUT`` writes the body to it, ``DELETE`` removes it."""

    def body_limit(self) -> int:
        return int(self.config.max_file_bytes)

    async def get(self, sandbox_id: str) -> None:
        path = self.path_arg()
        offset = int_argument(self.get_query_argument("offset", None), "offset", 0, 2**62)
        length = int_argument(
            self.get_query_argument("length", None), "length", 0, self.config.max_file_bytes
        )
        data = await self.execution.read_file(sandbox_id, path, offset or 0, length)
        self.set_header("Content-Type", "application/octet-stream")
        self.finish(data)

    async def put(self, sandbox_id: str) -> None:
        path = self.path_arg()
        result = await self.execution.write_file(sandbox_id, path, self.body_bytes())
        self.write_json(result)

    async def delete(self, sandbox_id: str) -> None:
        recursive = self.get_query_argument("recursive", "false")
        if recursive not in ("true", "false"):
            raise BadRequest("query parameter 'recursive' must be 'true' or 'false'")
        await self.execution.delete_path(sandbox_id, self.path_arg(), recursive == "true")
        self.set_status(204)
        self.finish()


class DirHandler(_FsHandler):
    """``GET`` lists a directory."""

    async def get(self, sandbox_id: str) -> None:
        self.write_json(await self.execution.list_dir(sandbox_id, self.path_arg()))


class StatHandler(_FsHandler):
    """``GET`` describes one path."""

    async def get(self, sandbox_id: str) -> None:
        self.write_json(await self.execution.stat(sandbox_id, self.path_arg()))
