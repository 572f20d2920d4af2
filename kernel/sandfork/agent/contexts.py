"""Code contexts: stable ids bound to successive ipykernel processes.

The default context always exists; isolated contexts are created on request. A context whose
kernel died is reported with a ``context_status`` event and restarted by the next ``ctx.send``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import shutil
import tempfile
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from .protocol import AgentError, Frame

if TYPE_CHECKING:
    import zmq.asyncio

    from .kernel import KernelProcess

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = "default"
# A kernel that keeps using CPU may take this long to start (a loaded host, an emulated
# guest); one that uses none for KERNEL_STALL_S is stuck. The host's deadline for the
# operations that start one covers the cap (backends/agent_link.py, KERNEL_START_S).
KERNEL_START_CAP_S = 600.0
KERNEL_STALL_S = 60.0

EmitCallback = Callable[[Frame], None]


class Context:
    """A code context and the kernel currently serving it.

    ``status`` is one of ``starting``, ``running``, ``dead`` (the kernel died; the next send
    restarts it) or ``stopped`` (shut down, or not started yet).
    """

    def __init__(self, context_id: str) -> None:
        self.id = context_id
        self.kernel: KernelProcess | None = None
        self.status = "stopped"
        self.generation = 0
        # Serializes start/restart/shutdown and sends, so a message never reaches a kernel
        # that is being replaced.
        self.lock = asyncio.Lock()

    def describe(self) -> Frame:
        """The protocol's description of this context."""
        return {"id": self.id, "language": "python", "status": self.status}


class ContextRegistry:
    """All code contexts of the agent, and the kernel plumbing they share."""

    def __init__(self, emit: EmitCallback) -> None:
        self._emit = emit
        self._contexts: dict[str, Context] = {DEFAULT_CONTEXT: Context(DEFAULT_CONTEXT)}
        self._kernel_module: ModuleType | None = None
        self._zmq: zmq.asyncio.Context | None = None
        self._runtime_dir: str | None = None
        self._background: set[asyncio.Task[None]] = set()

    def start_default(self) -> None:
        """Start the default context's kernel in the background."""
        task = asyncio.create_task(self._start_default())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _start_default(self) -> None:
        try:
            await self._ensure_running(self._contexts[DEFAULT_CONTEXT])
        except AgentError as exc:
            log.error("default kernel failed to start: %s", exc.message)

    def get(self, context_id: str) -> Context:
        """The context with this id, or NotFound."""
        try:
            return self._contexts[context_id]
        except KeyError:
            raise AgentError("NotFound", f"no context {context_id!r}") from None

    def kernel_ports(self) -> frozenset[int]:
        """The ports the kernels listen on themselves (not their users' servers)."""
        return frozenset().union(*(c.kernel.own_ports for c in self._contexts.values() if c.kernel))

    def describe_all(self) -> list[Frame]:
        """Descriptions of all contexts."""
        return [ctx.describe() for ctx in self._contexts.values()]

    async def create(self, isolated: bool) -> Frame:
        """Return the default context, or a new isolated one; either way with a ready kernel."""
        if isolated:
            ctx = Context(uuid.uuid4().hex[:12])
            self._contexts[ctx.id] = ctx
            try:
                await self._ensure_running(ctx)
            except AgentError:
                self._contexts.pop(ctx.id, None)
                raise
        else:
            ctx = self._contexts[DEFAULT_CONTEXT]
            await self._ensure_running(ctx)
        return ctx.describe()

    async def send(self, context_id: str, channel: str, msg: Frame) -> None:
        """Send a host message to the context's kernel, (re)starting the kernel if needed."""
        ctx = self.get(context_id)
        async with ctx.lock:
            kernel = await self._ensure_running_locked(ctx)
            await kernel.send(channel, msg)

    async def interrupt(self, context_id: str) -> None:
        """Interrupt the running cell (a no-op unless a kernel is running)."""
        ctx = self.get(context_id)
        async with ctx.lock:
            if ctx.status == "dead":
                raise AgentError("KernelDied", f"the kernel of context {ctx.id!r} is dead")
            if ctx.kernel is not None:
                ctx.kernel.interrupt()

    async def restart(self, context_id: str) -> None:
        """Replace the context's kernel with a fresh one, keeping the context id."""
        ctx = self.get(context_id)
        async with ctx.lock:
            await self._stop_kernel(ctx)
            await self._launch(ctx, restart_reason="restart requested")

    async def shutdown(self, context_id: str) -> None:
        """Stop the context's kernel; an isolated context is removed, the default one kept."""
        ctx = self.get(context_id)
        async with ctx.lock:
            await self._stop_kernel(ctx)
            if ctx.id != DEFAULT_CONTEXT:
                self._contexts.pop(ctx.id, None)

    async def close(self) -> None:
        """Kill every kernel and remove the runtime directory (agent shutdown)."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for ctx in list(self._contexts.values()):
            if ctx.kernel is not None:
                await ctx.kernel.kill()
                ctx.kernel = None
        if self._zmq is not None:
            self._zmq.term()
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)

    async def _ensure_running(self, ctx: Context) -> KernelProcess:
        async with ctx.lock:
            return await self._ensure_running_locked(ctx)

    async def _ensure_running_locked(self, ctx: Context) -> KernelProcess:
        if ctx.kernel is not None and ctx.status == "running":
            return ctx.kernel
        reason = None
        if ctx.status == "dead":
            reason = "restarted after the kernel died"
        await self._stop_kernel(ctx)
        return await self._launch(ctx, restart_reason=reason)

    async def _stop_kernel(self, ctx: Context) -> None:
        kernel, ctx.kernel = ctx.kernel, None
        ctx.status = "stopped"
        if kernel is not None:
            await kernel.kill()

    async def _launch(self, ctx: Context, restart_reason: str | None) -> KernelProcess:
        """Start a kernel for ``ctx`` and wait until it is ready (caller holds the lock)."""
        ctx.status = "starting"
        try:
            module = await self._load_kernel_module()
            ctx.generation += 1
            kernel: KernelProcess = module.KernelProcess(
                f"{ctx.id}-{ctx.generation}",
                self._runtime(),
                self._zmq_context(module),
                lambda channel, msg: self._on_message(ctx, channel, msg),
                lambda k, reason: self._on_exit(ctx, k, reason),
            )
            ctx.kernel = kernel
            await kernel.start()
            await kernel.wait_ready(KERNEL_STALL_S, KERNEL_START_CAP_S)
        except BaseException:
            if ctx.kernel is not None:
                with contextlib.suppress(Exception):
                    await ctx.kernel.kill()
            ctx.kernel = None
            ctx.status = "dead"
            raise
        ctx.status = "running"
        if restart_reason is not None:
            self._emit(
                {
                    "id": None,
                    "event": "context_status",
                    "context": ctx.id,
                    "status": "restarted",
                    "reason": restart_reason,
                }
            )
        return kernel

    async def _load_kernel_module(self) -> ModuleType:
        if self._kernel_module is None:
            # Importing jupyter_client and zmq takes a while; keep the loop (and ping) free.
            try:
                self._kernel_module = await asyncio.to_thread(
                    importlib.import_module, ".kernel", __package__
                )
            except ImportError as exc:
                raise AgentError("Internal", f"code contexts are unavailable: {exc}") from None
        return self._kernel_module

    def _zmq_context(self, module: ModuleType) -> zmq.asyncio.Context:
        if self._zmq is None:
            self._zmq = module.zmq.asyncio.Context()
        return self._zmq

    def _runtime(self) -> str:
        if self._runtime_dir is None:
            self._runtime_dir = tempfile.mkdtemp(prefix="sandfork-agent-")
        return self._runtime_dir

    def _on_message(self, ctx: Context, channel: str, msg: Frame) -> None:
        self._emit(
            {"id": None, "event": "kernel", "context": ctx.id, "channel": channel, "msg": msg}
        )

    def _on_exit(self, ctx: Context, kernel: KernelProcess, reason: str) -> None:
        if ctx.kernel is not kernel:
            return
        # A kernel dying while it starts also fails that launch, which marks the context dead.
        ctx.status = "dead"
        self._emit(
            {
                "id": None,
                "event": "context_status",
                "context": ctx.id,
                "status": "dead",
                "reason": reason,
            }
        )
