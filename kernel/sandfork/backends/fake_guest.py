"""The fake backend's guest (:mod:`sandfork.backends.fake`): one fake sandbox serving the
agent protocol on a Unix socket over an in-memory dict of files; ``exec`` answers the command
as its output."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import posixpath
from pathlib import Path
from typing import Any

from sandfork.backends.agent_link import AgentErrorReply
from sandfork.protocol import DEFAULT_CONTEXT

TIMES_OUT = "fake: run past the timeout"  # the one command the fake agent reports as killed
_HOME = "/root"  # where relative paths start, as in the real agent


class FakeFailure(RuntimeError):
    """A failure a test asked for (:meth:`FakeHost.fail`), or a guest that is gone."""


class FakeGuest:
    """One fake sandbox: its files (base64 by absolute path), its agent, whether it runs."""

    def __init__(self, pid: int, socket: Path, files: dict[str, str], disk: Path) -> None:
        self.pid = pid
        self.socket = socket
        self.files = files
        self.disk = disk  # the layer it writes, as a running VM's chain names it
        self.alive = True
        self.frozen = False  # paused in place
        self.failure = ""  # why it ended
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def serve(self) -> None:
        # Frames carry whole files in base64, as the real agent's do.
        self._server = await asyncio.start_unix_server(self._client, self.socket, limit=1 << 27)

    def stop(self, reason: str) -> None:
        """End the guest: its agent stops answering, connections drop."""
        self.alive, self.failure = False, self.failure or reason
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        self.socket.unlink(missing_ok=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        with contextlib.suppress(OSError, ValueError):  # the host went away, or sent junk
            while line := await reader.readline():
                for frame in self._frames(line):
                    writer.write(json.dumps(frame).encode() + b"\n")
                await writer.drain()
        self._writers.discard(writer)
        writer.close()

    def _frames(self, line: bytes) -> list[dict[str, Any]]:
        """The frames answering one request line (none for a line that is not a request)."""
        try:
            request = json.loads(line)
            req_id, op = request["id"], str(request["op"])
        except (ValueError, KeyError, TypeError):
            return []
        try:
            answer = getattr(self, "op_" + op.replace(".", "_"), None)
            if answer is None and op not in _CONSTANT:
                raise AgentErrorReply("BadRequest", f"the fake agent has no operation {op!r}")
            result = _CONSTANT[op] if answer is None else answer(request)
        except AgentErrorReply as e:
            return [{"id": req_id, "ok": False, "error": {"type": e.type, "message": e.message}}]
        events = []
        if op == "exec" and request.get("stream"):
            events = [{"id": req_id, "event": "stdout", "data": result["stdout"]}]
        return [*events, {"id": req_id, "ok": True, "result": result}]

    # -- the operations (docs/agent-protocol.md) -----------------------------------------------

    def op_ping(self, _: dict[str, Any]) -> dict[str, Any]:
        return {"version": "fake", "boot_id": str(self.pid), "uptime_s": 0, "pid": self.pid}

    def op_exec(self, request: dict[str, Any]) -> dict[str, Any]:
        out = {"exit_code": 0, "stdout": str(request.get("cmd", "")), "stderr": ""}  # never run
        timed_out = request.get("cmd") == TIMES_OUT
        return {**out, "duration_ms": 0, "timed_out": timed_out, "truncated": False}

    def op_fs_write(self, request: dict[str, Any]) -> dict[str, Any]:
        path = _path(request)
        data = str(request.get("data", ""))
        self.files[path] = data
        return {"path": path, "size": len(base64.b64decode(data))}

    def op_fs_read(self, request: dict[str, Any]) -> dict[str, Any]:
        data = base64.b64decode(self._file(_path(request)))
        offset, length = int(request.get("offset") or 0), request.get("length")
        part = data[offset:] if length is None else data[offset : offset + int(length)]
        return {"data": base64.b64encode(part).decode(), "size": len(data)}

    def op_fs_stat(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._stat(_path(request))

    def op_fs_list(self, request: dict[str, Any]) -> dict[str, Any]:
        path = _path(request)
        if not self._stat(path)["is_dir"]:
            raise AgentErrorReply("NotADirectory", f"{path} is not a directory")
        prefix = path.rstrip("/") + "/"
        names = {f[len(prefix) :].split("/")[0] for f in self.files if f.startswith(prefix)}
        return {"entries": [self._stat(prefix + n) for n in sorted(names)], "truncated": False}

    def _file(self, path: str) -> str:
        if path not in self.files:
            raise AgentErrorReply("IsADirectory" if self._is_dir(path) else "NotFound", path)
        return self.files[path]

    def _is_dir(self, path: str) -> bool:
        prefix = path.rstrip("/") + "/"
        return path == "/" or any(f.startswith(prefix) for f in self.files)

    def _stat(self, path: str) -> dict[str, Any]:
        is_dir = self._is_dir(path)
        size = 0 if is_dir else len(base64.b64decode(self._file(path)))
        stat = {"name": posixpath.basename(path), "path": path, "is_dir": is_dir, "size": size}
        return {**stat, "mode": "0755" if is_dir else "0644", "mtime": 0}


# The fake runs no kernels: the engine sees the default context stopped, so a snapshot's
# variable inventory is "unavailable" at once instead of waiting for a kernel's answer.
_CONTEXT = {"id": DEFAULT_CONTEXT, "language": "python", "status": "stopped"}
_CONSTANT: dict[str, Any] = {"ctx.list": {"contexts": [_CONTEXT]}, "ctx.create": _CONTEXT}
_CONSTANT |= {"sys.set_time": {}, "sys.reseed": {}}


def _path(request: dict[str, Any]) -> str:
    return posixpath.normpath(posixpath.join(_HOME, str(request.get("path", ""))))
