"""A test double of a backend, for tests of the engine's own rules, in this process.

Not a product backend, nor a stand-in in the backends' own tests (those run the real ones).
No kernel, QEMU, CRIU or process is started: each sandbox is a *guest* object serving the
agent protocol (``docs/agent-protocol.md``) on a Unix socket, with the few operations the
engine's paths need, over an in-memory dict of files (``exec`` answers the command as its
output). A capture writes the files as JSON into the snapshot's state folder and a restore
loads them; disk layers are small JSON files naming the layer below, made through
``CaptureRequest.new_layer`` like the real ones, so layer chains and collection run for real.

Guests live in a :class:`FakeHost`, which outlives a backend as VMs outlive an engine. A test
steers it: :meth:`~FakeHost.kill` ends a guest on its own, :meth:`~FakeHost.fail` makes the
next ``create``, ``restore`` or ``snapshot`` raise, :meth:`~FakeHost.gate` holds one until
the test lets it go on, and :attr:`~FakeHost.calls` counts them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandfork.backends.agent_link import AgentLink
from sandfork.backends.base import Captured, CaptureRequest, MachineSpec, StartPoint
from sandfork.backends.fake_guest import FakeFailure, FakeGuest
from sandfork.templates import BuiltTemplate

if TYPE_CHECKING:
    from sandfork.backends.base import Backend, DiskImages, Instance

RECORD = "fake.json"  # in a sandbox's folder: its guest's pid (what adopt and sweep read)
STATE = "state.json"  # in a capture's folder: the guest's files
DISK = "disk.fake"  # a boot capture's disk layer
SUFFIX = ".fake"
FIRST_PID = 10_000_000  # above Linux's largest pid (2**22): never a real process
Spawned = Callable[[int], None] | None


class FakeImages:
    """Disk layers as small JSON files naming the layer below (the template's names none)."""

    suffix = SUFFIX

    def create_overlay(self, base: Path, overlay: Path) -> None:
        overlay.write_text(json.dumps({"backing": str(base)}))

    def backing_chain(self, image: Path) -> list[Path]:  # a missing layer raises
        chain = [image]
        while below := json.loads(chain[-1].read_text()).get("backing"):
            chain.append(Path(below))
        return chain

    def rebase(self, layer: Path, backing: Path) -> None:  # a fake layer holds nothing else
        self.create_overlay(backing, layer)


@dataclass
class Gate:
    """An operation held at its step: ``reached`` once there, it goes on once ``opened``."""

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    opened: asyncio.Event = field(default_factory=asyncio.Event)


class FakeHost:
    """Where fake guests run, by pid (outliving backends); :meth:`close` it at the end."""

    def __init__(self) -> None:
        # Sockets in a short folder of their own: a socket's path is limited to 107 bytes.
        self.sockets = Path(tempfile.mkdtemp(prefix="sandfork-fake-"))
        self.guests: dict[int, FakeGuest] = {}
        self.calls: Counter[str] = Counter()  # create, restore, snapshot, boot_capture
        self.gates: dict[str, Gate] = {}
        self._failing: dict[str, Exception] = {}
        self._pids = itertools.count(FIRST_PID)

    async def spawn(self, files: dict[str, str], disk: Path) -> FakeGuest:
        """A new running guest with these files, writing to ``disk``."""
        pid = next(self._pids)
        guest = FakeGuest(pid, self.sockets / f"{pid}.sock", dict(files), disk)
        await guest.serve()
        self.guests[pid] = guest
        return guest

    def kill(self, pid: int, reason: str) -> None:
        """The guest's process ends on its own (a crash, the OOM killer), saying ``reason``."""
        self.guests[pid].stop(reason)

    def end(self, pid: int) -> bool:
        """Stop and forget a guest; False if there was none."""
        guest = self.guests.pop(pid, None)
        if guest is not None:
            guest.stop("stopped by the engine")
        return guest is not None

    def fail(self, op: str, error: Exception | None = None) -> None:
        """Make the next ``op`` (``create``, ``restore``, ``snapshot``, ``boot_capture``)
        raise ``error`` (a :class:`FakeFailure` unless given) at its step."""
        self._failing[op] = error or FakeFailure(f"injected {op} failure")

    def gate(self, op: str) -> Gate:
        """Hold the next ``op`` at its step until the test opens the gate."""
        self.gates[op] = gate = Gate()
        return gate

    async def step(self, op: str) -> None:
        """Count ``op``, hold it at its gate, fail it if told: ``create`` and ``restore`` once
        the guest runs, ``snapshot`` once its disk layer exists (registered, in no record),
        ``destroy`` once the guest has ended, before its files go."""
        self.calls[op] += 1
        gate = self.gates.pop(op, None)
        if gate is not None:
            gate.reached.set()
            await gate.opened.wait()
        if op in self._failing:
            raise self._failing.pop(op)

    def close(self) -> None:
        """End every guest and remove the sockets' folder."""
        for pid in list(self.guests):
            self.end(pid)
        shutil.rmtree(self.sockets, ignore_errors=True)


class FakeInstance:
    """A running fake sandbox as the engine sees it."""

    def __init__(self, host: FakeHost, guest: FakeGuest, directory: Path) -> None:
        self.pid = guest.pid
        self.agent = AgentLink(str(guest.socket))
        self.guest = guest
        self._host = host
        self._directory = directory

    def is_alive(self) -> bool:
        return self.guest.alive

    def failure_reason(self) -> str:
        return self.guest.failure

    def memory_bytes(self) -> int:
        return len(json.dumps(self.guest.files))  # what a capture stores

    async def open_egress(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """No egress channel: the engine's tests of the fake run without one."""
        raise FakeFailure("a fake sandbox has no egress channel")

    async def disk_chain(self) -> list[Path]:
        return FakeImages().backing_chain(self.guest.disk)

    async def resumed(self) -> None:
        await self.agent.request("sys.set_time", {"epoch_ns": time.time_ns()})
        await self.agent.request("sys.reseed", {"entropy": base64.b64encode(b"0" * 32).decode()})

    def console_path(self) -> Path:
        return self._directory / "console.log"  # never written: a fake guest says nothing

    async def freeze(self) -> None:
        self.guest.frozen = True

    async def thaw(self) -> None:
        self.guest.frozen = False

    async def snapshot(self, dest: Path, request: CaptureRequest) -> Captured:
        """The files into ``dest``; the disk layer freezes, the guest writes a new one."""
        (dest / STATE).write_text(json.dumps(self.guest.files))
        layer = request.new_layer(request.disk, SUFFIX)
        FakeImages().create_overlay(request.disk, layer)
        await self._host.step("snapshot")
        self.guest.disk = layer
        return Captured(paused=0.0, disk=request.disk, sandbox_disk=layer, layers=(layer,))

    async def destroy(self) -> None:
        self._host.end(self.pid)
        await self.agent.close()
        await self._host.step("destroy")  # a test may hold it: its files are still there
        shutil.rmtree(self._directory, ignore_errors=True)


class FakeBackend:
    """The fake backend over ``host``. The engine knows backends by the names ``vm`` and
    ``container``: the fake takes the place of one (``poses_as``)."""

    memory_suffix: str | None = None  # the state is in the state folder
    captures_in_memory = True
    shares_memory = False
    fetched_lazily: tuple[str, ...] = ()

    accelerator = "fake"
    isolation = "none"  # nothing separates a fake sandbox from the engine

    def __init__(self, host: FakeHost, poses_as: str = "vm") -> None:
        self.name = poses_as
        self.host = host
        self.images = FakeImages()

    def machine_key(self) -> str:
        return "fake"

    def spec(self, template: BuiltTemplate, memory_mb: int, cpu: int) -> MachineSpec:
        return MachineSpec(self.name, memory_mb, cpu, "fake", {"template": template.name})

    def base_disk(self, template: BuiltTemplate) -> Path:
        return template.rootfs

    async def create(
        self, spec: MachineSpec, directory: Path, disk: Path, spawned: Spawned = None, **_: bool
    ) -> FakeInstance:
        return await self._start("create", {}, directory, disk, spawned)

    async def restore(
        self, start: StartPoint, directory: Path, disk: Path, spawned: Spawned = None, **_: bool
    ) -> FakeInstance:
        assert start.dir is not None
        files = json.loads((start.dir / STATE).read_text())
        return await self._start("restore", files, directory, disk, spawned)

    async def _start(
        self, op: str, files: dict[str, str], directory: Path, disk: Path, spawned: Spawned
    ) -> FakeInstance:
        directory.mkdir(parents=True, exist_ok=True)
        guest = await self.host.spawn(files, disk)
        (directory / RECORD).write_text(json.dumps({"pid": guest.pid}))
        if spawned is not None:
            spawned(guest.pid)
        await self.host.step(op)
        return await self._attach(guest, directory)

    async def boot_capture(self, spec: MachineSpec, template: BuiltTemplate, dest: Path) -> None:
        await self.host.step("boot_capture")
        (dest / STATE).write_text("{}")
        self.images.create_overlay(self.base_disk(template), dest / DISK)

    def capture_at(self, directory: Path, spec: MachineSpec) -> StartPoint:
        return StartPoint(directory, spec, directory / DISK, [])

    def capture_files(self, directory: Path) -> tuple[list[Path], Path]:
        return [directory / STATE, directory / DISK], directory / STATE

    async def adopt(self, directory: Path, disk: Path, pid: int) -> FakeInstance:
        guest = self.host.guests.get(pid)
        if _pid(directory) != pid or guest is None or not guest.alive:
            raise FakeFailure("its fake guest is gone")
        guest.frozen = False  # as the real backends' adopt does
        return await self._attach(guest, directory)

    async def _attach(self, guest: FakeGuest, directory: Path) -> FakeInstance:
        instance = FakeInstance(self.host, guest, directory)
        await instance.agent.connect(timeout=10.0, alive=instance.is_alive)
        return instance

    def release(self, directory: Path) -> None:
        pid = _pid(directory)
        if pid is not None:
            self.host.end(pid)
        shutil.rmtree(directory, ignore_errors=True)

    def sweep(self, root: Path, keep: set[str]) -> list[str]:
        gone = []
        for directory in list(root.iterdir()) if root.exists() else []:
            if directory.name in keep or not (directory / RECORD).exists():
                continue
            if _pid(directory) in self.host.guests:
                gone.append(f"fake guest {_pid(directory)} ({directory.name})")
            self.release(directory)  # ends the guest too
            gone.append(f"directory {directory}")
        return gone

    def unavailable(self) -> str | None:
        return None


def _pid(directory: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads((directory / RECORD).read_text())["pid"])
    return None


if TYPE_CHECKING:  # mypy holds the fake to the interface the engine sees

    def _conforms(host: FakeHost, guest: FakeGuest) -> tuple[Backend, Instance, DiskImages]:
        return FakeBackend(host), FakeInstance(host, guest, Path()), FakeImages()
