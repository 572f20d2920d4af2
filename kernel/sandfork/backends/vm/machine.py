"""One running QEMU VM: launch, adopt after an engine restart, health, QMP, destroy."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from qemu.qmp import ConnectError, QMPClient

from sandfork.backends.agent_link import ADOPT_WAIT_S, AgentLink
from sandfork.backends.base import Captured, CaptureRequest
from sandfork.backends.processes import start_time
from sandfork.backends.vm.launch_record import VmError, read_record, write_record
from sandfork.backends.vm.memory_layers import (
    FULL_IMAGE_BYTES,
    materialize,
    restore_pages,
    write_capture,
)
from sandfork.backends.vm.process_memory import PAGE, RamMapping, page_buffer
from sandfork.backends.vm.qemu import VM_FILE_SUFFIXES, Network, VmLayout, VmSpec, command_line
from sandfork.backends.vm.write_tracking import WriteTracker, preload_environment
from sandfork.crashpoints import crash_point
from sandfork.holdpoints import hold_point

DEVICES_FILE = "devices.state"
MEMORY_SUFFIX = ".mem"
DISK_SUFFIX = ".qcow2"


GUEST_NICENESS = 10
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


class Machine:
    """A QEMU process running one sandbox, and the channel to its guest agent.

    The process runs in its own session so it outlives the engine; a restarted engine
    re-attaches with :meth:`adopt`.
    """

    def __init__(
        self,
        layout: VmLayout,
        pid: int,
        process: subprocess.Popen[bytes] | None,
        image: Path,
        copy_memory: bool = False,
    ) -> None:
        self.layout = layout
        self.copy_memory = copy_memory  # captures copy all memory while paused (to compare)
        self.pid = pid
        self._process = process
        self.image = image  # the memory image QEMU maps as guest RAM
        self.agent = AgentLink(str(layout.agent_socket))
        self._started = start_time(pid)
        # The memory layer that the guest's RAM is, but for the pages the tracker has seen
        # written since (None: unknown, the next capture compares every written page).
        self._tracked_over: Path | None = None

    @classmethod
    async def launch(
        cls,
        spec: VmSpec,
        layout: VmLayout,
        boot_timeout: float,
        snapshot: Path | None = None,
        spawned: Callable[[int], None] | None = None,
        network: Network | None = None,
        memory: list[Path] | None = None,
        copy_memory: bool = False,
        track_writes: bool = True,
    ) -> Machine:
        """Start a VM on ``layout.disk`` and wait for its agent.

        Without ``snapshot`` the guest boots on zeroed memory of its own; with it, the VM
        resumes the snapshot's device state (written by :meth:`snapshot`) with the memory of
        the chain ``memory`` (see :mod:`~sandfork.backends.vm.memory_layers`): its full
        image mapped copy-on-write, the deltas above written into the VM before it runs.
        Both must come from a VM of the same ``spec``. ``spawned`` is told QEMU's pid as soon
        as the process exists, so that an engine killed while the VM comes up leaves a
        process it can find again. ``network`` defaults to a restricted one; a snapshot
        restores under any network. ``copy_memory`` copies the chain's memory into a RAM
        file of the VM's own instead of mapping it (the way before copy-on-write, to compare).
        ``track_writes`` has the pages the guest writes tracked (:mod:`write_tracking`), so
        that a capture costs what changed since the previous one.
        """
        longest = max(layout.sockets, key=lambda p: len(os.fsencode(p)))
        if len(os.fsencode(longest)) > _MAX_SOCKET_PATH:
            raise VmError(
                f"the socket path {longest} is longer than the {_MAX_SOCKET_PATH} bytes a Unix "
                "socket allows: use a shorter state directory"
            )
        layout.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        layout.ram_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        memory = memory or []
        if snapshot is not None and not memory:
            raise VmError("restoring needs the snapshot's memory")
        if snapshot is None:
            image = layout.ram_file
            with image.open("xb") as f:  # zeros, costing nothing until the guest writes
                f.truncate(spec.memory_mb * 2**20)
        elif copy_memory:
            image = layout.ram_file
            await asyncio.to_thread(materialize, image, memory, spec.memory_mb * 2**20 // PAGE)
            memory = [image]
        else:
            image = memory[-1]
        command = command_line(spec, layout, network or Network(), image)
        if snapshot is not None:
            # Incoming: QEMU's reset would otherwise copy the -kernel/-initrd blobs over RAM.
            command += ["-incoming", "defer"]
        tracking = preload_environment(image) if track_writes and not copy_memory else {}
        with layout.qemu_log.open("wb") as log:
            process = subprocess.Popen(
                # Guests yield to the engine, so its API stays responsive on a busy machine:
                # a lower priority, and SCHED_BATCH, whose threads never preempt the engine
                # when they wake up (every request to a VM wakes one of its threads).
                ["chrt", "--batch", "0", "nice", "-n", str(GUEST_NICENESS), *command],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=layout.dir,
                env={**os.environ, **tracking},
                umask=0o077,  # guest RAM, disk layers and sockets are private to this user
            )
        machine = cls(layout, process.pid, process, image, copy_memory)
        write_record(layout.dir, process.pid, image)
        try:
            if spawned is not None:
                spawned(process.pid)
            if snapshot is not None:
                await machine._load_state(snapshot / DEVICES_FILE, memory, spec, boot_timeout)
            await machine.agent.connect(timeout=boot_timeout, alive=machine.is_alive)
        except Exception as e:
            reason = machine.failure_reason() or str(e)
            await machine.destroy()
            raise VmError(f"the sandbox VM did not come up: {reason}") from e
        return machine

    @classmethod
    async def adopt(
        cls, layout: VmLayout, pid: int, timeout: float = ADOPT_WAIT_S, *, copy_memory: bool = False
    ) -> Machine:
        """Re-attach to a VM started by an earlier engine process.

        A VM left paused by an engine that died in the middle of a snapshot is resumed.
        """
        record = read_record(layout.dir)
        if record.get("pid") != pid or start_time(pid) != record.get("start"):
            raise VmError("its QEMU process is gone")
        machine = cls(layout, pid, None, Path(str(record["image"])), copy_memory)
        if not machine.is_alive():
            raise VmError("its QEMU process is gone")
        status = await machine.qmp("query-status")
        if not status.get("running"):
            await machine.qmp("cont")
        await machine.agent.connect(timeout=timeout, alive=machine.is_alive)
        return machine

    def is_alive(self) -> bool:
        """True while this VM's QEMU process runs."""
        if self._process is not None:
            return self._process.poll() is None
        # A recycled pid belongs to some other program: the start time tells them apart.
        return self._started is not None and start_time(self.pid) == self._started

    def failure_reason(self) -> str:
        """Why the VM stopped, from QEMU's exit status, its log and the guest console."""
        parts = []
        if self._process is not None and self._process.poll() is not None:
            code = self._process.returncode
            parts.append(
                f"QEMU killed by signal {-code}" if code < 0 else f"QEMU exited with status {code}"
            )
        for path in (self.layout.qemu_log, self.layout.console_log):
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").strip().splitlines()[-5:]
                if tail:
                    parts.append(f"{path.name}: " + " | ".join(tail))
        return "; ".join(parts)

    async def open_egress(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to the guest's egress channel (QEMU serves it on a Unix socket)."""
        return await asyncio.open_unix_connection(str(self.layout.egress_socket))

    def memory_bytes(self) -> int:
        """Guest memory the VM has written since its memory image was mapped."""
        try:
            return len(self._ram().written_pages()) * PAGE
        except (OSError, LookupError):
            return 0

    def _ram(self) -> RamMapping:
        return RamMapping.find(self.pid, self.image)

    async def disk_chain(self) -> list[Path]:
        """The files of the VM's root disk as QEMU has them open, top (written) first."""
        devices = await self.qmp("query-block")
        for device in devices:
            if device.get("device") == "root" and "inserted" in device:
                chain, image = [], device["inserted"]["image"]
                while image is not None:
                    chain.append(Path(image["filename"]))
                    image = image.get("backing-image")
                return chain
        raise VmError("QEMU reports no root disk")

    async def qmp(self, command: str, **arguments: Any) -> Any:
        """Run one QMP command on this VM."""
        async with self._qmp() as client:
            return await client.execute(command, arguments or None)

    @contextlib.asynccontextmanager
    async def _qmp(self, wait: float = 10.0) -> AsyncIterator[QMPClient]:
        client = QMPClient("sandfork")
        deadline = time.monotonic() + wait
        while True:
            try:
                await client.connect(str(self.layout.qmp_socket))
                break
            except (OSError, ConnectError):
                if time.monotonic() > deadline or not self.is_alive():
                    raise
                await asyncio.sleep(0.01)
        try:
            yield client
        finally:
            await client.disconnect()

    async def _load_state(
        self, devices: Path, memory: list[Path], spec: VmSpec, timeout: float
    ) -> None:
        async with self._qmp(timeout) as qmp:  # QEMU is up: its RAM is mapped
            pages = spec.memory_mb * 2**20 // PAGE
            numbers, data = await asyncio.to_thread(restore_pages, memory, pages)
            ram = self._ram()
            await asyncio.to_thread(ram.write, numbers, data)
            del data
            if await asyncio.to_thread(WriteTracker(ram).arm):  # writes tracked from here on
                self._tracked_over = memory[0]
            await qmp.execute("migrate-incoming", {"uri": f"exec:cat {shlex.quote(str(devices))}"})
            await _wait_migration(qmp, timeout)
            await qmp.execute("cont")

    async def snapshot(self, dest: Path, request: CaptureRequest) -> Captured:
        """Capture memory, devices and disk at one instant into ``dest``.

        The VM is paused while its disk layer is frozen (new writes go to a new overlay), its
        device state is saved, and the pages that may differ from ``request.memory`` (the
        chain the VM's memory last matched) are copied out: the pages written since that
        chain was captured or restored where writes are tracked, else every page written
        since the memory image was mapped. Then it runs on, and those pages are stored in a
        new memory layer: the ones that differ as a delta over the chain, or everything as a
        full image (see :func:`memory_layers.write_capture`). The frozen disk layer is the
        snapshot's.
        """
        memory = request.memory
        new_disk = request.new_layer(request.disk, DISK_SUFFIX)
        new_memory = request.new_layer(memory[0] if memory else None, MEMORY_SUFFIX)
        ram = self._ram()
        tracker = WriteTracker(ram)
        tracked = self._tracked_over is not None and memory[:1] == [self._tracked_over]
        self._tracked_over = None  # unknown until this capture is stored
        changed = tracker.written if tracked else ram.written_pages
        expected = len(await asyncio.to_thread(changed))
        buffer = await asyncio.to_thread(page_buffer, expected + expected // 8 + 1024)
        async with self._qmp() as qmp:
            await qmp.execute("stop")
            paused = time.monotonic()
            try:
                await qmp.execute(
                    "blockdev-snapshot-sync",
                    {"device": "root", "snapshot-file": str(new_disk), "format": "qcow2"},
                )
                target = str(dest / DEVICES_FILE)
                await qmp.execute("xen-save-devices-state", {"filename": target, "live": False})
                crash_point("snapshot.paused")
                numbers = await asyncio.to_thread(tracker.take if tracked else ram.written_pages)
                armed = tracked or await asyncio.to_thread(tracker.arm)
                if len(numbers) > len(buffer):
                    buffer = await asyncio.to_thread(page_buffer, len(numbers))
                await asyncio.to_thread(ram.read, numbers, buffer)
                if self.copy_memory:  # the way before copy-on-write: all of it, paused
                    args = (new_memory, numbers, buffer[: len(numbers)], memory, ram.pages)
                    await asyncio.to_thread(write_capture, *args, full=True)
            finally:
                await qmp.execute("cont")
            pause = time.monotonic() - paused
        write = functools.partial(
            write_capture, new_memory, numbers, buffer[: len(numbers)], memory, ram.pages
        )
        backing, writing = None, None
        if not self.copy_memory:  # (copying wrote it while paused)
            tracked_over = new_memory if armed else None
            if request.defer_memory and len(numbers) * PAGE > FULL_IMAGE_BYTES:
                writing = asyncio.ensure_future(self._write(write, tracked_over, later=True))
            else:
                backing = await self._write(write, tracked_over)
        return Captured(
            paused=pause,
            disk=request.disk,
            sandbox_disk=new_disk,
            memory=new_memory,
            memory_backing=backing,
            sandbox_memory=new_memory,
            layers=(new_disk, new_memory),
            memory_written=writing,
        )

    async def _write(
        self, write: Callable[[], Path | None], tracked_over: Path | None, later: bool = False
    ) -> Path | None:
        """Write a capture's memory layer (``later``: after the capture returned); then, if
        writes were tracked from the capture on, the next capture reads only the pages
        written since (over that layer)."""
        if later:
            await hold_point("snapshot.writing")
        backing = await asyncio.to_thread(write)
        self._tracked_over = tracked_over
        return backing

    async def resumed(self) -> None:
        """A restored guest still has the clock and entropy of its capture: refresh both."""
        await self.agent.request("sys.set_time", {"epoch_ns": time.time_ns()})
        entropy = base64.b64encode(os.urandom(64)).decode()
        await self.agent.request("sys.reseed", {"entropy": entropy})

    def console_path(self) -> Path:
        """The guest's serial console."""
        return self.layout.console_log

    async def freeze(self) -> None:
        """Stop the VM's CPUs (QMP ``stop``)."""
        await self.qmp("stop")

    async def thaw(self) -> None:
        """Start its CPUs again; the guest's clock stood still meanwhile: set it."""
        await self.qmp("cont")
        await self.resumed()

    async def destroy(self) -> None:
        """Stop the VM and delete its directory (sockets, logs) and RAM file."""
        await self.agent.close()
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        await asyncio.to_thread(self._reap)
        await asyncio.to_thread(release, self.layout.ram_dir, self.layout.dir)

    def _reap(self) -> None:
        if self._process is not None:
            self._process.wait()
            return
        deadline = time.monotonic() + 5
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)


async def _wait_migration(qmp: QMPClient, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        info = await qmp.execute("query-migrate")
        assert isinstance(info, dict)
        status = info.get("status")
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            raise VmError(
                f"saving or loading the VM state failed: {info.get('error-desc', status)}"
            )
        if time.monotonic() > deadline:
            raise VmError(f"saving or loading the VM state took over {timeout:.0f} s")
        await asyncio.sleep(0.005)


def release(ram_dir: Path, directory: Path) -> None:
    """Delete a stopped VM's directory (logs), its RAM file and its sockets."""
    for suffix in VM_FILE_SUFFIXES:
        (ram_dir / f"{directory.name}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)
