"""``Filesystem``: the files inside a sandbox (``sandbox.filesystem``)."""

from __future__ import annotations

from typing import Any

from sandfork.client import SyncEngineClient, blocking
from sandfork.protocol import routes
from sandfork.sdk.errors import NotFoundError


class Filesystem:
    """Files inside the sandbox ``sandbox_id`` of the engine ``client`` talks to."""

    def __init__(self, client: SyncEngineClient, sandbox_id: str) -> None:
        self._engine = client.aio
        self._sandbox_id = sandbox_id

    def _path(self, action: str = "fs") -> str:
        return routes.sandbox(self._sandbox_id, action)

    async def async_read(self, path: str) -> bytes:
        """The bytes of ``path``."""
        return (await self._engine.fetch("GET", self._path(), params={"path": path})).content

    async def async_read_text(self, path: str) -> str:
        """The text of ``path`` (UTF-8)."""
        return (await self.async_read(path)).decode()

    async def async_write(self, path: str, content: bytes | str) -> dict[str, Any]:
        """Write ``content`` to ``path``, creating parent directories."""
        data = content.encode() if isinstance(content, str) else content
        return await self._engine.request(  # type: ignore[no-any-return]
            "PUT",
            self._path(),
            params={"path": path},
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )

    async def async_listdir(self, path: str = "/") -> list[dict[str, Any]]:
        """The entries of a directory."""
        listing = await self._engine.request("GET", self._path("fs/dir"), params={"path": path})
        return listing["entries"]  # type: ignore[no-any-return]

    async def async_stat(self, path: str) -> dict[str, Any]:
        """Name, size, mode, mtime and type of ``path``."""
        return await self._engine.request("GET", self._path("fs/stat"), params={"path": path})  # type: ignore[no-any-return]

    async def async_exists(self, path: str) -> bool:
        """True if ``path`` exists."""
        try:
            await self.async_stat(path)
        except NotFoundError:
            return False
        return True

    async def async_delete(self, path: str, recursive: bool = False) -> None:
        """Delete a file (or, with ``recursive``, a directory tree)."""
        params = {"path": path, "recursive": str(recursive).lower()}
        await self._engine.request("DELETE", self._path(), params=params)

    read = blocking(async_read)
    read_text = blocking(async_read_text)
    write = blocking(async_write)
    listdir = blocking(async_listdir)
    stat = blocking(async_stat)
    exists = blocking(async_exists)
    delete = blocking(async_delete)
