"""The lazy servers of one engine: a fetched snapshot's big files, readable before they are
all here (:mod:`sandfork.store.lazy_serve`, one process per fetch, mounted under ``lazy/``).

A restore started while its snapshot fills is handed the mount's paths for those files
(:meth:`LazyServers.hand`); once the server says ``filled``, the local files are whole and
later restores read them directly. The engine then closes the server's input, after the
last restore it handed paths to has started; the server exits when nothing reads it any
more. A marker ``lazy/<id>.filling`` stands while a snapshot fills: an engine that starts
and finds one drops that snapshot (the bucket still has it; the next restore fetches it
again) and lazily unmounts what the earlier engine's servers left, which keeps the files
open there readable for the sandboxes that read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sandfork.store.lazy_spec import Served, Source, Spec, mount_name

log = logging.getLogger(__name__)

START_S = 30.0  # for the server to mount: a bound on a hang, not a speed
MARKER = ".filling"


def unavailable() -> str | None:
    """Why a lazy server cannot mount here (``None``: it can)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    try:
        import mfusepy  # noqa: F401  (loads libfuse)
    except (ImportError, OSError) as e:
        return f"libfuse cannot be loaded: {e}"
    return None


@dataclass
class _Server:
    process: asyncio.subprocess.Process
    served: dict[str, Path]  # a file's path in the state folder -> its path on the mount
    filled: asyncio.Future[bool] = field(default_factory=asyncio.Future)
    handing: int = 0  # restores handed the mount's paths that have not started yet
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # handing is 0
    follower: asyncio.Task[None] | None = None


class LazyServers:
    """The lazy servers under ``root``, fetching from the store ``store`` describes (S3Store's
    settings and the signing key) and reading the engine's chunk cache ``cache``."""

    def __init__(self, root: Path, store: dict[str, str], cache: Path) -> None:
        self.root = root
        self.source = Source(store, str(cache))
        self._servers: dict[str, _Server] = {}
        # One server started ahead of need: its interpreter, modules and S3 client take about
        # 0.35 s, which a cold restore would otherwise wait for.
        self._ready: asyncio.subprocess.Process | None = None
        self._stopping = False
        root.mkdir(mode=0o700, parents=True, exist_ok=True)

    async def _start(self) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sandfork.store.lazy_serve",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,  # it outlives the engine while a sandbox reads it
        )
        assert process.stdin is not None
        process.stdin.write(self.source.to_json().encode() + b"\n")
        return process

    async def start(self) -> None:
        """Start the server kept ahead of need."""
        self._ready = await self._start()

    async def _take(self) -> asyncio.subprocess.Process:
        """The server started ahead of need, unless it died (the next one starts once this
        one's fill ended: not while the restore it serves wants the CPU)."""
        process, self._ready = self._ready, None
        if process is None or process.returncode is not None:
            return await self._start()
        return process

    def sweep(self) -> list[str]:
        """What an earlier engine left: its mounts are unmounted (lazily), and the ids of the
        snapshots whose fill never ended returned, their markers gone."""
        prefix = str(self.root) + "/"
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f]
        for mount in mounts:
            if mount.startswith(prefix):
                subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        unfinished = []
        for entry in self.root.iterdir():
            if entry.name.endswith(MARKER):
                unfinished.append(entry.name.removesuffix(MARKER))
                entry.unlink()
            elif entry.is_dir():
                with contextlib.suppress(OSError):
                    entry.rmdir()
        return unfinished

    def mark(self, snapshot_id: str) -> None:
        """Note that ``snapshot_id`` is filling (before it is listed)."""
        (self.root / f"{snapshot_id}{MARKER}").touch(mode=0o600)

    def unmark(self, snapshot_id: str) -> None:
        """Note that ``snapshot_id`` is whole."""
        (self.root / f"{snapshot_id}{MARKER}").unlink(missing_ok=True)

    async def serve(self, snapshot_id: str, files: list[Served]) -> asyncio.Future[bool] | None:
        """Start a server for ``files`` of ``snapshot_id``, mounted: a future of whether its
        fill ended well; ``None`` if it did not mount (the reason is logged)."""
        mount = self.root / snapshot_id
        mount.mkdir(mode=0o700, exist_ok=True)
        spec = Spec(str(mount), files)
        process = await self._take()
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(spec.to_json().encode() + b"\n")
            await process.stdin.drain()
            async with asyncio.timeout(START_S):
                line = await process.stdout.readline()
        except (OSError, TimeoutError) as e:
            line = f"{type(e).__name__}: {e}".encode()
        if line != b"mounted\n":
            log.warning(
                "the lazy server of %s did not mount (%r): fetching whole", snapshot_id, line
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            with contextlib.suppress(OSError):
                mount.rmdir()
            return None
        server = _Server(process, {f.name: mount / mount_name(f.name) for f in files})
        server.idle.set()
        self._servers[snapshot_id] = server
        server.follower = asyncio.create_task(self._follow(snapshot_id, server))
        return server.filled

    async def _follow(self, snapshot_id: str, server: _Server) -> None:
        """Wait for the server's fill; then, once no restore waits on its paths, close its
        input and wait for it to end."""
        assert server.process.stdin is not None and server.process.stdout is not None
        line = await server.process.stdout.readline()
        ok = line == b"filled\n"
        if not ok:
            log.error(
                "the lazy server of %s failed: %r", snapshot_id, line.decode(errors="replace")
            )
        server.filled.set_result(ok)
        if self._ready is None and not self._stopping:
            self._ready = await self._start()
        await server.idle.wait()
        self._servers.pop(snapshot_id, None)
        server.process.stdin.close()
        await server.process.wait()
        with contextlib.suppress(OSError):
            (self.root / snapshot_id).rmdir()

    @contextlib.contextmanager
    def hand(self, snapshot_id: str) -> Iterator[dict[str, Path]]:
        """The paths a restore of ``snapshot_id`` reads its lazy files from (none once they
        are whole), good until the restore started and left this block."""
        server = self._servers.get(snapshot_id)
        if server is None or server.filled.done():
            yield {}
            return
        server.handing += 1
        server.idle.clear()
        try:
            yield dict(server.served)
        finally:
            server.handing -= 1
            if server.handing == 0:
                server.idle.set()

    async def stop(self) -> None:
        """Wait for the fills under way (a snapshot left filling is dropped at the next
        start); the servers go on for the sandboxes still reading them. The one started
        ahead of need ends."""
        self._stopping = True
        for server in list(self._servers.values()):
            await asyncio.shield(server.filled)
        if self._ready is not None and self._ready.stdin is not None:
            self._ready.stdin.close()
            await self._ready.wait()
