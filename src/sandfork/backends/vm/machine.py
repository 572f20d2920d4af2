"""One running QEMU VM: launch, adopt after an engine restart, health, QMP, destroy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from qemu.qmp import QMPClient

from sandfork.backends.channel import AgentChannel
from sandfork.backends.vm.qemu import VmLayout, VmSpec, command_line, create_overlay


class VmError(Exception):
    """The VM could not be started or has failed."""


class Machine:
    """A QEMU process running one sandbox, and the channel to its guest agent.

    The process runs in its own session so it outlives the engine; a restarted engine
    re-attaches with :meth:`adopt`.
    """

    def __init__(self, layout: VmLayout, pid: int, process: subprocess.Popen[bytes] | None) -> None:
        self.layout = layout
        self.pid = pid
        self._process = process
        self.agent = AgentChannel(str(layout.agent_socket))

    @classmethod
    async def launch(
        cls, spec: VmSpec, base_image: Path, directory: Path, boot_timeout: float
    ) -> Machine:
        """Boot a new VM over a fresh overlay of ``base_image`` and wait for its agent."""
        layout = VmLayout(directory)
        directory.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(create_overlay, base_image, layout.overlay)
        with layout.qemu_log.open("wb") as log:
            process = subprocess.Popen(
                command_line(spec, layout),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=directory,
            )
        machine = cls(layout, process.pid, process)
        try:
            await machine.agent.connect(timeout=boot_timeout, alive=machine.is_alive)
        except Exception as e:
            reason = machine.failure_reason() or str(e)
            await machine.destroy()
            raise VmError(f"the sandbox VM did not come up: {reason}") from e
        return machine

    @classmethod
    async def adopt(cls, directory: Path, pid: int, timeout: float = 10.0) -> Machine:
        """Re-attach to a VM started by an earlier engine process."""
        machine = cls(VmLayout(directory), pid, None)
        if not machine.is_alive():
            raise VmError("its QEMU process is gone")
        await machine.agent.connect(timeout=timeout, alive=machine.is_alive)
        return machine

    def is_alive(self) -> bool:
        """True while this VM's QEMU process runs."""
        if self._process is not None:
            return self._process.poll() is None
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        # A recycled pid belongs to some other program: our command line names our directory.
        state = stat.rsplit(")", 1)[-1].split()[0]
        return str(self.layout.dir).encode() in cmdline and state != "Z"

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

    async def qmp(self, command: str, **arguments: Any) -> Any:
        """Run one QMP command on this VM."""
        client = QMPClient("sandfork")
        await client.connect(str(self.layout.qmp_socket))
        try:
            return await client.execute(command, arguments or None)
        finally:
            await client.disconnect()

    async def destroy(self) -> None:
        """Stop the VM and delete its directory (overlay, sockets, logs)."""
        await self.agent.close()
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        await asyncio.to_thread(self._reap)
        await asyncio.to_thread(shutil.rmtree, self.layout.dir, True)

    def _reap(self) -> None:
        if self._process is not None:
            self._process.wait()
            return
        deadline = time.monotonic() + 5
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
