"""The ZMQ side of the proxy kernel: the five sockets of the connection file, relayed to a
sandbox's code context through a :class:`~sandfork.proxy_kernel.link.SandboxLink`.

Messages are verified with the connection file's key and re-signed with it on the way back;
the guest's messages keep their ids and parents, so replies route to the client that asked.

The relay is synchronous wherever it can be: the sockets are drained by event-loop reader
callbacks and a message goes on to the WebSocket in the same callback (its JSON parts spliced in
as they are), and the guest's frames go out on ZMQ in tornado's read callback. Only requests
the proxy handles itself (magics, interrupt, shutdown, a request that must wake a hibernated
sandbox first) and checkpoints run as tasks, and their channel waits for them, so that
messages keep their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, cast

import zmq

from sandfork.proxy_kernel import kernel_info, magics
from sandfork.proxy_kernel.checkpoints import CellCheckpoints
from sandfork.proxy_kernel.hibernation import IdleTimer, watch
from sandfork.proxy_kernel.lease import keep_leased, renew
from sandfork.proxy_kernel.link import GuestMessage, SandboxLink, keep_linked
from sandfork.proxy_kernel.session import Request
from sandfork.proxy_kernel.sockets import KernelSockets
from sandfork.proxy_kernel.state import Binding, save_state
from sandfork.sdk import Sandbox, SandforkError

log = logging.getLogger(__name__)


class KernelProxy:
    """Relays one Jupyter connection file's sockets to a sandbox's code context.

    While it runs, it renews the lease (``lease_seconds``) of the sandbox it owns, and
    hibernates the sandbox after ``hibernate_after`` idle seconds (0: never).
    """

    def __init__(
        self,
        connection: dict[str, Any],
        binding: Binding,
        state: Path,
        lease_seconds: float,
        checkpoints: CellCheckpoints | None = None,
        hibernate_after: float = 0,
    ) -> None:
        self.binding = binding
        self.controls = magics.KernelControls(
            lease_seconds, checkpoints or CellCheckpoints(), IdleTimer(hibernate_after)
        )
        self.checkpoints, self.idle = self.controls.checkpoints, self.controls.idle
        self.state = state
        self.lease_seconds = lease_seconds
        self.zmq = KernelSockets(connection, self._drain)
        self._sockets = self.zmq.sockets
        self._routes: dict[str, list[bytes]] = {}  # request msg_id -> client identities
        self._held: dict[str, asyncio.Task[None]] = {}  # channel -> the request it waits for
        self._link = self._new_link()
        self.info = kernel_info.KernelInfo()
        self._stop = asyncio.Event()
        self._closing = False  # a shutdown request is being served (or SIGTERM)
        self._restarting = False  # ... one with restart: the next process takes the sandbox
        self._ending: asyncio.Task[None] | None = None  # the end SIGTERM asked for
        self._waking: asyncio.Task[None] | None = None  # the wake requests wait for

    def _new_link(self) -> SandboxLink:
        sandbox = self.binding.sandbox
        return SandboxLink(sandbox.client.aio, sandbox.id, self.binding.context, self._from_guest)

    # -- running -------------------------------------------------------------------------

    async def run(self) -> None:
        """Relay until a shutdown request (or :meth:`stop`)."""
        await self._link.open()
        sandbox = self._leased_sandbox()
        if sandbox is not None:  # the kernel's own lease, in force before it says it attached
            try:
                await renew(sandbox, self.lease_seconds)
            except SandforkError as e:
                log.warning("could not take the lease of sandbox %s: %s", sandbox.id, e)
        if self.checkpoints.enabled:  # configured, or a restarted kernel's: start the history
            try:
                await self.checkpoints.turn_on(self.binding.sandbox)
            except SandforkError as e:
                attached = self.binding.sandbox.id
                log.warning("the first checkpoint of sandbox %s failed: %s", attached, e)
        self._save()
        loop = asyncio.get_running_loop()
        for channel in ("shell", "control", "stdin", "hb"):
            loop.add_reader(self._sockets[channel].FD, self._drain, channel)
            loop.call_soon(self._drain, channel)  # what came before: no edge wakes us for it
        linked = keep_linked(lambda: self._link, lambda: self._closing, self._sandbox_gone)
        keep_linked_task = asyncio.create_task(linked)
        leased = asyncio.create_task(keep_leased(self._leased_sandbox, self.lease_seconds))
        sleeper = asyncio.create_task(watch(self.idle, self._busy, self._hibernate))
        try:
            await self._stop.wait()
        finally:
            for channel in ("shell", "control", "stdin", "hb"):
                loop.remove_reader(self._sockets[channel].FD)
            tasks = [keep_linked_task, leased, sleeper, *self._held.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._link.close()
            self.zmq.close()

    def stop(self) -> None:
        """End :meth:`run`."""
        self._stop.set()

    def terminate(self) -> None:
        """SIGTERM: end now, killing the kernel's own sandbox first.

        Not when a restart is under way (jupyter_client sends SIGTERM to a kernel slow to
        restart): the sandbox is then the next process's; nor twice.
        """
        if self._ending is None:
            self._ending = asyncio.create_task(self._end())

    async def _end(self) -> None:
        if self._closing and not self._restarting:
            return  # a shutdown request is killing the sandbox and then stops the relay
        if self._restarting or self.zmq.restart_requested():
            self.stop()
            return
        self._closing = True
        self._link.close()
        sandbox = self.binding.sandbox
        if self.binding.leased:
            try:
                await sandbox.async_kill()
            except SandforkError as e:
                log.warning("could not kill sandbox %s: %s", sandbox.id, e)
        if self.binding.owned:
            self.state.unlink(missing_ok=True)
        self.stop()

    def _leased_sandbox(self) -> Sandbox | None:
        """The sandbox whose lease the kernel keeps, if it keeps one now."""
        return None if self._closing or not self.binding.leased else self.binding.sandbox

    def _drain(self, channel: str) -> None:
        """Handle every message waiting on ``channel`` (ZMQ's descriptor is edge-triggered:
        it wakes us once for any number of messages, and a send on the socket can eat it)."""
        sock = self._sockets[channel]
        while not self._stop.is_set() and cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN:
            if channel in self._held:  # the wake-up is taken all the same: no busy loop
                return
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            if channel == "hb":  # echoed while the sandbox's channels are up (or it sleeps)
                if self._link.connected or self.idle.asleep:
                    sock.send_multipart(frames)
                continue
            try:
                request = self.zmq.session.receive(channel, frames)
            except (ValueError, TypeError, KeyError) as e:
                log.warning("dropping a malformed or unsigned %s message: %s", channel, e)
                continue
            if self.info.answer(request, self.zmq, self.describe):  # no use of it: still idle
                continue
            self.idle.touch()
            work = self._handle(request)
            if work is not None:
                self._hold(channel, work)

    def _handle(self, request: Request) -> Coroutine[Any, Any, None] | None:
        """Forward a client's message, or return the work of one the proxy answers itself."""
        kind = request.header["msg_type"]
        if self.idle.asleep and kind not in ("interrupt_request", "shutdown_request"):
            return self._woken(request)
        if request.channel == "control" and kind == "interrupt_request":
            return self._interrupt(request)
        if request.channel == "control" and kind == "shutdown_request":
            return self._shutdown(request)
        if kind == "execute_request":
            content = request.content()
            magic = magics.parse(content.get("code", ""))
            if magic is not None:
                return self._run_magic(request, magic)
            if not content.get("silent"):
                self._cell_started(request, content.get("code", ""))
        self._forward(request)
        return None

    def _hold(self, channel: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work``; ``channel`` is not read until it is done."""
        task = asyncio.create_task(work)
        self._held[channel] = task

        def release(_: asyncio.Task[None]) -> None:
            del self._held[channel]
            if not task.cancelled() and task.exception() is not None:
                log.error("handling a %s request failed", channel, exc_info=task.exception())
            self._drain(channel)

        task.add_done_callback(release)

    def _forward(self, request: Request) -> None:
        if request.header["msg_type"].endswith("_request"):
            self._routes[request.header["msg_id"]] = request.idents
        try:
            self._link.send(request.channel, request.parts, request.buffers)
        except ConnectionError as e:
            self._reply_unreachable(request, str(e))

    # -- control -------------------------------------------------------------------------

    async def _interrupt(self, request: Request) -> None:
        content: dict[str, Any] = {"status": "ok"}
        try:
            await self._link.interrupt()
        except SandforkError as e:
            content = {"status": "error", "ename": "InterruptFailed", "evalue": str(e)}
            content["traceback"] = []
        self.zmq.reply(request, "interrupt_reply", content)

    async def _shutdown(self, request: Request) -> None:
        """``restart``: a fresh guest kernel in the same sandbox, for the next process.

        Otherwise the sandbox is killed, unless it is persistent or not the kernel's own.
        """
        restart = bool(request.content().get("restart"))
        sandbox = self.binding.sandbox
        self._closing, self._restarting = True, restart
        try:
            if restart:
                await self._link.restart()
                self._save()
            else:
                self.state.unlink(missing_ok=True)
                if self.binding.owned and not sandbox.persistent:
                    self._link.close()
                    await sandbox.async_kill()
        except SandforkError as e:
            log.warning("shutdown of sandbox %s: %s", sandbox.id, e)
        self.zmq.reply(request, "shutdown_reply", {"status": "ok", "restart": restart})
        self.zmq.publish("shutdown_reply", {"status": "ok", "restart": restart}, request.header)
        self.stop()

    # -- magics --------------------------------------------------------------------------

    async def _run_magic(self, request: Request, magic: magics.Magic) -> None:
        """Run a proxy magic, then have the guest run its stand-in in the request's place."""
        outcome: magics.Outcome | magics.MagicError
        try:
            sandbox = self.binding.sandbox
            outcome = await magics.run(magic, sandbox, self.controls)
        except magics.MagicError as e:
            outcome = e
        if isinstance(outcome, magics.Outcome) and outcome.sandbox is not None:
            await self._repoint(outcome.sandbox)
        self._save()
        content = {**request.content(), "code": magics.stand_in(magic, outcome)}
        if magic.rest.strip() and not content.get("silent"):  # the rest of the cell runs
            self._cell_started(request, magic.rest)
        request.parts[3] = self.zmq.session.pack(content)
        self._forward(request)

    async def _repoint(self, sandbox: Sandbox) -> None:
        """Run on ``sandbox`` from now on; the previous one goes if it was the kernel's own."""
        old = self.binding
        self.binding = Binding(sandbox, old.context, owned=True)
        previous, self._link = self._link, self._new_link()
        previous.close()
        try:
            await self._link.open()
        except SandforkError as e:  # keep_linked tries again
            log.warning("cannot reach sandbox %s yet: %s", sandbox.id, e)
        self._save()
        if old.owned and not old.sandbox.persistent:
            with contextlib.suppress(SandforkError):
                await old.sandbox.async_kill()

    # -- from the guest --------------------------------------------------------------------

    def _from_guest(self, message: GuestMessage) -> None:
        self.idle.touch()
        msg_type = message.header.get("msg_type", "")
        if message.channel == "iopub":
            self.zmq.relay("iopub", [f"kernel.sandfork.{msg_type}".encode()], message)
            return
        parent = message.parent_header.get("msg_id", "")
        idents = self._routes.get(parent)
        if idents is None:
            log.debug("no client for a %s %s", message.channel, msg_type)
            return
        if message.channel in ("shell", "control") and msg_type.endswith("_reply"):
            del self._routes[parent]
            if msg_type == kernel_info.REPLY:
                self.info.relayed(message, self.describe())
        self.zmq.relay(message.channel, idents, message)
        if msg_type == "execute_reply":
            metadata = self.checkpoints.finished(parent, message.parts[3])
            if metadata is not None and "shell" not in self._held:
                # The next request waits for the checkpoint: it holds this cell's state.
                self._hold("shell", self._cell_checkpoint(metadata))

    def _cell_started(self, request: Request, code: str) -> None:
        metadata = json.loads(request.parts[2])
        self.checkpoints.started(request.header["msg_id"], code, metadata)

    async def _cell_checkpoint(self, metadata: dict[str, str]) -> None:
        """Take a cell's checkpoint (the engine's capture pauses the sandbox for what the
        cell changed, so the kernel stays in its sandbox)."""
        sandbox = self.binding.sandbox
        try:
            await self.checkpoints.take(sandbox, metadata)
        except SandforkError as e:
            log.warning("the checkpoint of sandbox %s failed: %s", sandbox.id, e)

    def describe(self) -> dict[str, Any]:
        """The sandbox the kernel uses now, as its ``kernel_info_reply`` says it."""
        attached = self.binding
        checkpoints = self.checkpoints.state()
        return kernel_info.describe(
            attached.sandbox.id, attached.context, attached.owned, checkpoints
        )

    def _save(self) -> None:
        save_state(self.state, self.binding, self.checkpoints.state())

    def _reply_unreachable(self, request: Request, reason: str) -> None:
        self._routes.pop(request.header["msg_id"], None)
        evalue = f"the sandbox {self.binding.sandbox.id} cannot be reached: {reason}"
        self.zmq.unreachable(request, evalue)

    # -- hibernation ---------------------------------------------------------------------

    def _busy(self) -> bool:
        """True while a request waits for its reply or the proxy handles one itself."""
        return bool(self._routes or self._held)

    async def _hibernate(self) -> None:
        """Hibernate the sandbox: its channels close, and the next request wakes it."""
        sandbox = self.binding.sandbox
        self.idle.asleep = True
        previous, self._link = self._link, self._new_link()  # opened again on waking
        previous.close()
        try:
            await sandbox.async_hibernate()
            log.info("sandbox %s hibernated after %g s idle", sandbox.id, self.idle.after)
        except SandforkError as e:
            log.warning("could not hibernate sandbox %s: %s", sandbox.id, e)
            if self._waking is None:  # else a request is waking it already
                with contextlib.suppress(SandforkError):
                    await self._wake()

    async def _wake(self) -> None:
        await self.binding.sandbox.async_wake()
        await self._link.open()
        self.idle.asleep = False
        self.idle.touch()

    async def _woken(self, request: Request) -> None:
        """Wake the sandbox (once for all the requests that wait for it), then handle
        ``request`` as if it had never slept."""
        if self._waking is None:
            self._waking = asyncio.create_task(self._wake())
        waking = self._waking
        try:
            await asyncio.shield(waking)
        except SandforkError as e:
            self._reply_unreachable(request, f"it did not wake from hibernation: {e}")
            return
        finally:
            if self._waking is waking and waking.done():
                self._waking = None
        work = self._handle(request)
        if work is not None:
            await work

    def _sandbox_gone(self, reason: str) -> None:
        self.zmq.publish("stream", {"name": "stderr", "text": reason + "\n"}, {})
        self.zmq.publish("status", {"execution_state": "dead"}, {})
