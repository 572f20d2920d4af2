"""``Filesystem``: the files inside a sandbox (``sandbox.filesystem``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandfork.sdk.errors import NotFoundError

if TYPE_CHECKING:
    from sandfork.sdk.sandbox import Sandbox


class Filesystem:
    """Files inside a sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def _path(self, suffix: str = "") -> str:
        return f"/sandboxes/{self._sandbox.id}/fs{suffix}"

    def read(self, path: str) -> bytes:
        """The bytes of ``path``."""
        return self._sandbox.client.raw("GET", self._path(), params={"path": path}).content

    def read_text(self, path: str) -> str:
        """The text of ``path`` (UTF-8)."""
        return self.read(path).decode()

    def write(self, path: str, content: bytes | str) -> dict[str, Any]:
        """Write ``content`` to ``path``, creating parent directories."""
        data = content.encode() if isinstance(content, str) else content
        return self._sandbox.client.request(
            "PUT",
            self._path(),
            params={"path": path},
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )  # type: ignore[no-any-return]

    def listdir(self, path: str = "/") -> list[dict[str, Any]]:
        """The entries of a directory."""
        return self._sandbox.client.request("GET", self._path("/dir"), params={"path": path})[
            "entries"
        ]  # type: ignore[no-any-return]

    def stat(self, path: str) -> dict[str, Any]:
        """Name, size, mode, mtime and type of ``path``."""
        return self._sandbox.client.request("GET", self._path("/stat"), params={"path": path})  # type: ignore[no-any-return]

    def exists(self, path: str) -> bool:
        """True if ``path`` exists."""
        try:
            self.stat(path)
        except NotFoundError:
            return False
        return True

    def delete(self, path: str, recursive: bool = False) -> None:
        """Delete a file (or, with ``recursive``, a directory tree)."""
        self._sandbox.client.request(
            "DELETE", self._path(), params={"path": path, "recursive": str(recursive).lower()}
        )
