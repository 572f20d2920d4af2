"""One running container sandbox as the engine sees it: its shim, agent link and captures.

A capture is ``criu dump --leave-running`` of the sandbox's PID 1 into the snapshot's
``images/``. The sandbox is frozen from CRIU's seizing to its release; at CRIU's
``post-dump`` action (everything dumped, nothing resumed yet) its hook asks the engine, over a
Unix socket, to copy the writable layer (:func:`.layers.capture`), so the files and the
memory of a snapshot are of the same instant. If the engine dies meanwhile, the hook's socket
closes, CRIU resumes the sandbox and the next engine adopts it as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from sandfork.backends.agent_link import AgentLink
from sandfork.backends.base import Captured, CaptureRequest
from sandfork.backends.container import layers
from sandfork.backends.container.cgroups import Cgroup
from sandfork.backends.container.criu import Criu
from sandfork.backends.container.lazy_pages import DONE
from sandfork.backends.container.restoring import WORK
from sandfork.backends.container.shim import CONSOLE, EXIT, RECORD
from sandfork.backends.container.shim_pool import ShimPool
from sandfork.backends.container.stdio import ShimConfig
from sandfork.backends.processes import start_time
from sandfork.crashpoints import crash_point

IMAGES = "images"  # the CRIU image folder of a snapshot
PIPES = "pipes.json"  # the dumped sandbox's pipe inodes, by its fd: what a restore replaces
DUMP_LOG = "dump.log"
_SHIM_STOP_S = 10.0
_STATS_DUMP = "stats-dump"

log = logging.getLogger(__name__)


class ContainerError(Exception):
    """The container sandbox could not be started, captured or stopped."""


class ContainerSandbox:
    """A sandbox's shim (its process), its agent link, its group and its files."""

    def __init__(
        self,
        directory: Path,
        disk: Path,
        sockets: dict[str, Path],
        links: Path,
        cgroup: Cgroup,
        criu: Criu,
        hook: Path,
        shim: int,
        process: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.dir = directory
        self.disk = disk  # its writable layer
        self.sockets = sockets
        self.links = links  # a restored sandbox's links to its image files (until served)
        self.cgroup = cgroup
        self.criu = criu
        self.hook = hook
        self.pid = shim
        self._process = process
        self._shim_start = start_time(shim)
        self.agent = AgentLink(str(sockets["agent"]))
        self.last_layer: Path | None = None  # its latest capture's disk layer (for links)

    # -- starting -------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        config: ShimConfig,
        shims: ShimPool,
        *,
        disk: Path,
        sockets: dict[str, Path],
        links: Path,
        cgroup: Cgroup,
        criu: Criu,
        hook: Path,
        timeout: float,
        spawned: Callable[[int], None] | None = None,
    ) -> ContainerSandbox:
        """Start the shim of a new or restored sandbox and wait for its agent."""
        directory = Path(config.dir)
        process = shims.start(config)
        sandbox = cls(directory, disk, sockets, links, cgroup, criu, hook, process.pid, process)
        try:
            if spawned is not None:
                spawned(process.pid)
            await sandbox.agent.connect(timeout=timeout, alive=sandbox.is_alive)
        except Exception as e:
            reason = sandbox.failure_reason() or str(e)
            await sandbox.destroy()
            raise ContainerError(f"the container sandbox did not come up: {reason}") from e
        return sandbox

    def record(self) -> dict[str, object]:
        """What the shim wrote once the sandbox ran (its PID 1, the pipes' inodes)."""
        try:
            data = json.loads((self.dir / RECORD).read_text())
        except (OSError, ValueError) as e:
            raise ContainerError(f"the sandbox's record is unreadable: {e}") from e
        if not isinstance(data, dict):
            raise ContainerError("the sandbox's record is not an object")
        return data

    @property
    def init(self) -> int:
        """The host pid of the sandbox's PID 1."""
        value = self.record().get("init")
        if not isinstance(value, int):
            raise ContainerError("the sandbox's record has no init process")
        return value

    # -- health ---------------------------------------------------------------------------

    def is_alive(self) -> bool:
        """True while the shim runs and its sandbox has not ended."""
        if self._process is not None and self._process.poll() is not None:
            return False
        if self._shim_start is None or start_time(self.pid) != self._shim_start:
            return False  # gone, or the pid now belongs to another process
        return not (self.dir / EXIT).exists()

    def failure_reason(self) -> str:
        """Why the sandbox stopped: the shim's note and the end of its console."""
        parts = []
        with contextlib.suppress(OSError, ValueError):
            parts.append(str(json.loads((self.dir / EXIT).read_text())["reason"]))
        if self._process is not None and self._process.returncode not in (None, 0):
            parts.append(f"its shim exited with status {self._process.returncode}")
        for name in (CONSOLE, "shim.log"):
            with contextlib.suppress(OSError):
                tail = (self.dir / name).read_text(errors="replace").strip().splitlines()[-3:]
                if tail:
                    parts.append(f"{name}: " + " | ".join(tail))
        return "; ".join(parts)

    def memory_bytes(self) -> int:
        """The memory of the sandbox's group: about what a capture stores."""
        return self.cgroup.memory_bytes()

    async def open_egress(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The sandbox's egress channel: its shim relays it to fds 3 and 4 of the agent."""
        return await asyncio.open_unix_connection(str(self.sockets["egress"]))

    async def disk_chain(self) -> list[Path]:
        """Its writable layer and the layers below, down to the template's tree."""
        return layers.chain(self.disk)

    async def resumed(self) -> None:
        """Nothing to refresh: a container shares the host's clock and entropy pool."""

    def console_path(self) -> Path:
        """What its processes write on their stderr outside any request (the shim keeps it)."""
        return self.dir / CONSOLE

    async def freeze(self) -> None:
        """Freeze its control group (the kernel stops every process in it)."""
        await asyncio.to_thread(self.cgroup.freeze, True)

    async def thaw(self) -> None:
        """Thaw its group; it shares the host's clock, so nothing else is needed."""
        await asyncio.to_thread(self.cgroup.freeze, False)

    # -- capture --------------------------------------------------------------------------

    async def snapshot(self, dest: Path, request: CaptureRequest) -> Captured:
        """Dump the sandbox into ``dest/images`` and copy its writable layer into a new
        layer while it is frozen; it runs on, unmoved."""
        record = self.record()
        await self._pages_in_place(record)
        new_disk = request.new_layer(layers.backing(self.disk), layers.SUFFIX)
        images = dest / IMAGES
        images.mkdir()
        (dest / PIPES).write_text(json.dumps(record["pipes"]))
        work = self.dir / "dump"
        work.mkdir(exist_ok=True)
        hook_socket = work / "hook.sock"
        copied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        previous = (
            self.last_layer if self.last_layer is not None and self.last_layer.exists() else None
        )

        async def on_frozen(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.readline()
                crash_point("snapshot.paused")  # frozen: a killed engine lets CRIU resume it
                await asyncio.to_thread(layers.capture, self.disk, new_disk, previous)
                copied.set_result(None)
            except Exception as e:
                if not copied.done():
                    copied.set_exception(e)
            finally:
                writer.write(b"go\n")
                with contextlib.suppress(OSError):
                    await writer.drain()
                writer.close()

        hook_socket.unlink(missing_ok=True)
        server = await asyncio.start_unix_server(on_frozen, path=str(hook_socket))
        started = time.monotonic()
        try:
            command = self.criu.command(
                "dump", "-t", str(self.init), "-D", str(images), "-W", str(work),
                "-o", DUMP_LOG, "--leave-running", "--tcp-established",
                "--network-lock", "nftables", "--manage-cgroups=ignore",
                "--action-script", str(self.hook),
            )  # fmt: skip
            env = {**self.criu.env(), "SANDFORK_DUMP_HOOK": str(hook_socket)}
            process = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            code = await process.wait()
        finally:
            server.close()
            hook_socket.unlink(missing_ok=True)
        elapsed = time.monotonic() - started
        if code != 0 or not copied.done():
            if copied.done() and copied.exception() is not None:
                raise ContainerError(f"copying the sandbox's files failed: {copied.exception()}")
            raise ContainerError(f"criu dump failed: {_log_errors(work / DUMP_LOG)}")
        copied.result()
        self.last_layer = new_disk
        paused = frozen_seconds(work / _STATS_DUMP)  # CRIU writes its statistics in -W
        return Captured(
            paused=paused if paused is not None else elapsed,
            disk=new_disk,
            sandbox_disk=self.disk,
            layers=(new_disk,),
        )

    async def _pages_in_place(self, record: dict[str, object]) -> None:
        """Wait until the lazy-pages server of a restored sandbox has put every page in place:
        CRIU dumps the pages a process has, so those still to come would restore as zeros."""
        pid, started = record.get("lazy"), record.get("lazy_start")
        if not isinstance(pid, int):
            return  # not restored lazily
        with contextlib.suppress(ProcessLookupError):
            fd = os.pidfd_open(pid)
            try:
                if started is not None and start_time(pid) == started:
                    log.info("a capture of %s waits for the pages still coming", self.dir.name)
                    ended = asyncio.Event()
                    loop = asyncio.get_running_loop()
                    loop.add_reader(fd, ended.set)  # readable once it has exited
                    try:
                        await ended.wait()
                    finally:
                        loop.remove_reader(fd)
            finally:
                os.close(fd)
        if not (self.dir / WORK / DONE).exists():
            reason = self.failure_reason() or "its lazy-pages server failed"
            raise ContainerError(f"the sandbox's memory did not all come back: {reason}")

    # -- the end --------------------------------------------------------------------------

    async def destroy(self) -> None:
        """Stop the sandbox (its shim ends its processes), then delete its group and files."""
        await self.agent.close()
        with contextlib.suppress(OSError, TimeoutError):  # a frozen v1 task ignores SIGKILL
            await self.thaw()
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            await asyncio.to_thread(self._wait_shim)
        if self.is_alive():  # it would not go: do its work
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        await asyncio.to_thread(self.cgroup.remove)
        for path in self.sockets.values():
            path.unlink(missing_ok=True)
        await asyncio.to_thread(shutil.rmtree, self.links, True)
        await asyncio.to_thread(shutil.rmtree, self.dir, True)

    def _wait_shim(self) -> None:
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(_SHIM_STOP_S)
            return
        deadline = time.monotonic() + _SHIM_STOP_S
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)


def _log_errors(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    errors = [line.split(":", 1)[-1].strip() for line in lines if "Error" in line]
    return " | ".join(errors[-3:]) or (lines[-1] if lines else "(empty log)")


def frozen_seconds(stats: Path) -> float | None:
    """How long CRIU kept the sandbox frozen, from its ``stats-dump.img`` (``None``: unread).

    The file is CRIU's image format: two magic numbers, then a size-prefixed protobuf
    ``StatsEntry`` whose field 1 is a ``DumpStatsEntry``, whose field 2 is ``frozen_time`` in
    microseconds.
    """
    try:
        data = stats.read_bytes()
        size = struct.unpack_from("<I", data, 8)[0]
        dump = _field(data[12 : 12 + size], 1)
        frozen = _field(dump, 2) if isinstance(dump, bytes) else None
    except (OSError, struct.error, IndexError, ValueError):
        return None
    return frozen / 1e6 if isinstance(frozen, int) else None


def _field(message: bytes, number: int) -> int | bytes | None:
    """The first field ``number`` of a protobuf message (varints and length-delimited)."""
    i = 0
    while i < len(message):
        key, i = _varint(message, i)
        kind = key & 7
        value: int | bytes | None
        if kind == 0:
            value, i = _varint(message, i)
        elif kind == 2:
            length, i = _varint(message, i)
            value, i = message[i : i + length], i + length
        elif kind in (1, 5):
            value, i = None, i + (8 if kind == 1 else 4)
        else:
            raise ValueError(f"protobuf wire type {kind}")
        if key >> 3 == number:
            return value
    return None


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
