"""What the server extension does: snapshot a notebook's sandbox with its document, draw the
lineage, restore a snapshot into a new notebook, fork a live notebook into branches.

Every operation that creates things undoes them if a later step fails: no half-created
notebook, session, kernel or sandbox is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from jupyter_server.utils import ensure_async
from tornado import web

from sandfork.client import EngineClient
from sandfork.jupyter import lineage
from sandfork.jupyter.errors import error_message, http_error
from sandfork.jupyter.kernels import (
    KERNEL_NAME,
    attached_sandbox,
    sandbox_kernels,
    sandfork_kernel_names,
    start_attached,
)
from sandfork.jupyter.lineage import NOTEBOOK
from sandfork.jupyter.notebooks import (
    checked_notebook,
    checked_path,
    delete_quietly,
    free_path,
    stored_notebook,
    stored_path,
    write_notebook,
)
from sandfork.jupyter.operations import Operation, Operations
from sandfork.protocol import (
    DEFAULT_CONTEXT,
    SandforkError,
    check_snapshot_name,
    is_snapshot_id,
)
from sandfork.sdk import Client, Sandbox, Snapshot
from sandfork.sdk.inventory import Inventory

T = TypeVar("T")


def checked_snapshot_id(snapshot_id: str) -> str:
    """``snapshot_id`` if it looks like one, else a 404 (it cannot exist)."""
    if not is_snapshot_id(snapshot_id):
        raise http_error(404, f"no snapshot {snapshot_id[:64]!r}")
    return snapshot_id


def checked_name(name: Any) -> str | None:
    """An optional snapshot name (the engine's rule), stripped of outer spaces."""
    return None if name is None else _checked_name(name)


def _checked_name(name: Any) -> str:
    try:
        return check_snapshot_name(name).strip()
    except ValueError as e:
        raise http_error(400, str(e)) from e


class SandforkService:
    """The operations behind the handlers, for one Jupyter server."""

    def __init__(
        self,
        serverapp: Any,
        engine: EngineClient,
        operations: Operations,
        max_branches: int,
        lease_seconds: float,
        max_json_depth: int,
        changed: Callable[[str], None],
    ) -> None:
        self.serverapp = serverapp
        self.engine = engine
        self.client = Client.wrapping(engine)  # the SDK's handles, awaited on the server's loop
        self.operations = operations
        self.max_branches = max_branches
        self.lease_seconds = lease_seconds  # of a new notebook's sandbox until its kernel's
        self.max_json_depth = max_json_depth  # of request bodies and stored notebooks
        self.changed = changed  # tells the panels what changed (LineageEvents.emit)
        self._naming = asyncio.Lock()  # picking a free name and writing it is one step

    @property
    def kernels(self) -> Any:
        return self.serverapp.kernel_manager

    @property
    def sessions(self) -> Any:
        return self.serverapp.session_manager

    @property
    def contents(self) -> Any:
        return self.serverapp.contents_manager

    async def call(self, work: Awaitable[T]) -> T:
        """An engine call whose failure becomes an HTTP error with the engine's message."""
        try:
            return await work
        except SandforkError as e:
            raise _http_error(e) from e

    # -- reading -------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """What the front end goes by: the branch limit, and which kernels are Sandfork's."""
        kernel_names = sandfork_kernel_names(self.serverapp.kernel_spec_manager)
        return {"max_branches": self.max_branches, "kernel_names": kernel_names}

    async def kernel(self, kernel_id: str) -> dict[str, Any]:
        """The sandbox behind a Sandfork kernel (for the status bar)."""
        attached = await attached_sandbox(self.kernels, kernel_id)
        sandbox = await self.call(Sandbox.async_get(attached.sandbox_id, self.client))
        keep = ["id", "template", "status", "isolation", "accelerator", "memory_mb", "cpu"]
        keep += ["from_snapshot", "metadata"]
        info = {k: getattr(sandbox, k) for k in keep}
        checkpoints = attached.checkpoints
        return {
            "kernel_id": kernel_id,
            "context": attached.context,
            "sandbox": info,
            "lineage": checkpoints.get("lineage"),
            "checkpoints": bool(checkpoints.get("enabled")),
        }

    async def kernel_ports(self, kernel_id: str, base_url: str) -> dict[str, Any]:
        """The ports a server listens on in a Sandfork kernel's sandbox, with their URLs on
        this server (:mod:`sandfork.jupyter.ports`)."""
        sandbox_id = (await attached_sandbox(self.kernels, kernel_id)).sandbox_id
        sandbox = await self.call(Sandbox.async_get(sandbox_id, self.client))
        ports = [
            {"port": port, "url": f"{base_url}sandfork/sandboxes/{sandbox_id}/ports/{port}/"}
            for port in await self.call(sandbox.async_ports())
        ]
        return {"sandbox_id": sandbox_id, "ports": ports}

    async def lineage(self) -> dict[str, Any]:
        """Snapshots and the sandboxes they relate to, for the side panel's graph."""
        snapshots = await self.call(Snapshot.async_list(client=self.client))
        sandboxes = await self.call(Sandbox.async_list(self.client))
        sessions = await ensure_async(self.sessions.list_sessions())
        return lineage.listing(snapshots, sandboxes, await sandbox_kernels(self.kernels), sessions)

    async def inventory(self, snapshot_id: str) -> dict[str, Any]:
        """The variables a snapshot holds (as captured with it)."""
        return lineage.inventory_entry(await self._inventory(snapshot_id))

    async def diff(self, before: str, after: str) -> dict[str, Any]:
        """What changed in the variables from snapshot ``before`` to ``after``."""
        old, new = await self._inventory(before), await self._inventory(after)
        return lineage.diff_entry(old, new, before, after)

    async def _inventory(self, snapshot_id: str) -> Inventory:
        snap = await self._snapshot(snapshot_id)
        return await self.call(snap.async_inventory())

    async def _snapshot(self, snapshot_id: str) -> Snapshot:
        return await self.call(Snapshot.async_get(checked_snapshot_id(snapshot_id), self.client))

    # -- snapshots -----------------------------------------------------------------------

    async def snapshot(
        self, kernel_id: str, path: Any, notebook: Any, name: Any, op_id: str | None
    ) -> dict[str, Any]:
        """Snapshot the sandbox behind ``kernel_id`` with the notebook document as sent."""
        path, document, name = checked_path(path), checked_notebook(notebook), checked_name(name)
        attached = await attached_sandbox(self.kernels, kernel_id)
        async with self._operation(op_id, f"Snapshot of {path}", 1) as op:
            op.advance("capturing memory, devices and disk")
            metadata = {"notebook_path": path, "kernel_id": kernel_id, "created_by": "jupyterlab"}
            sandbox = await self.call(Sandbox.async_get(attached.sandbox_id, self.client))
            snap = await self.call(
                sandbox.async_snapshot(name, metadata, attachments={NOTEBOOK: json.dumps(document)})
            )
        return lineage.snapshot_entry(snap)

    async def rename(self, snapshot_id: str, name: Any) -> dict[str, Any]:
        """Give a snapshot a new name."""
        checked_snapshot_id(snapshot_id)
        if name is None:
            raise http_error(400, "field 'name' is required")
        new_name = _checked_name(name)
        snap = await self._snapshot(snapshot_id)
        await self.call(snap.async_rename(new_name))
        return lineage.snapshot_entry(snap)

    async def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot (the engine refuses while a restore from it runs)."""
        await self.call((await self._snapshot(snapshot_id)).async_delete())

    # -- new notebooks -------------------------------------------------------------------

    async def restore(self, snapshot_id: str, op_id: str | None) -> dict[str, Any]:
        """A new notebook (the stored document) on a kernel in a sandbox restored from the
        snapshot."""
        checked_snapshot_id(snapshot_id)
        async with self._operation(op_id, f"Restore of {snapshot_id}", 4) as op:
            op.advance("reading the snapshot")
            snap = await self._snapshot(snapshot_id)
            if NOTEBOOK not in snap.attachments:
                raise http_error(
                    400,
                    f"snapshot {snapshot_id} has no notebook stored with it (it was not taken "
                    f"from JupyterLab); restore it in a notebook with %restore {snapshot_id}",
                )
            try:
                stored = await snap.async_attachment(NOTEBOOK)
            except SandforkError as e:
                raise http_error(502, str(e)) from e
            # Both are the snapshot's, which anyone with the engine's key may have written.
            document = stored_notebook(stored, self.max_json_depth)
            original = stored_path(snap.metadata.get("notebook_path"))
            folder = posixpath.dirname(original)
            if folder and not await ensure_async(self.contents.dir_exists(folder)):
                original = posixpath.basename(original)  # its folder is gone: use the root
            op.advance("restoring the sandbox (memory, devices, disk)")
            sandbox = await self.call(
                Sandbox.async_create(
                    from_snapshot=snap,
                    metadata={"created_by": "jupyterlab", "restored_for": original},
                    lease_seconds=self.lease_seconds,
                    client=self.client,
                )
            )
            async with contextlib.AsyncExitStack() as undo:
                undo.push_async_callback(_kill_quietly, sandbox)
                branch = await self._open(undo, op, original, "restored", document, sandbox.id)
                undo.pop_all()
        return branch

    async def fork(
        self, kernel_id: str, path: Any, notebook: Any, count: Any, op_id: str | None
    ) -> dict[str, Any]:
        """``count`` branch notebooks, each on a kernel in its own fork of the live sandbox."""
        path, document = checked_path(path), checked_notebook(notebook)
        if count is None:
            count = 1
        if not isinstance(count, int) or isinstance(count, bool):
            raise http_error(400, "field 'count' must be an integer")
        if not 1 <= count <= self.max_branches:
            raise http_error(400, f"count must be from 1 to {self.max_branches}")
        attached = await attached_sandbox(self.kernels, kernel_id)
        async with self._operation(op_id, f"Fork of {path}", 1 + 2 * count) as op:
            op.advance(f"forking the sandbox into {count}")
            parent = await self.call(Sandbox.async_get(attached.sandbox_id, self.client))
            metadata = {"created_by": "jupyterlab", "branch_of": path}
            children = await self.call(parent.async_fork_tree(count, metadata=metadata))
            async with contextlib.AsyncExitStack() as undo:
                for child in children:
                    undo.push_async_callback(_kill_quietly, child)
                    if not child.persistent:  # a persistent one is kept, not leased
                        await self.call(child.async_renew_lease(self.lease_seconds))
                branches = [
                    await self._open(undo, op, path, "branch", document, child.id, attached.context)
                    for child in children
                ]
                undo.pop_all()
        return {"branches": branches}

    async def _open(
        self,
        undo: contextlib.AsyncExitStack,
        op: Operation,
        original: str,
        suffix: str,
        document: dict[str, Any],
        sandbox_id: str,
        context: str = DEFAULT_CONTEXT,
    ) -> dict[str, Any]:
        """Write ``document`` under a free name next to ``original`` and open a session on it
        with a kernel attached to ``sandbox_id``; registers the undo steps on ``undo``."""
        op.advance("writing the notebook")
        async with self._naming:
            path = await free_path(self.contents, original, suffix)
            await write_notebook(self.contents, path, document)
        undo.push_async_callback(delete_quietly, self.contents, path)
        op.advance("starting the kernel")
        kernel_id = await start_attached(self.kernels, path, sandbox_id, context)
        try:
            session = await self.sessions.create_session(
                path=path, name=path, type="notebook", kernel_name=KERNEL_NAME, kernel_id=kernel_id
            )
        except BaseException:
            await self.kernels.shutdown_kernel(kernel_id, now=True)
            raise
        undo.push_async_callback(self._delete_session, session["id"])
        self.changed("session")  # the panel can name the kernel's notebook now
        return {"path": path, "sandbox_id": sandbox_id, "kernel_id": kernel_id, "session": session}

    async def _delete_session(self, session_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.sessions.delete_session(session_id)

    @contextlib.asynccontextmanager
    async def _operation(
        self, op_id: str | None, title: str, total: int
    ) -> AsyncIterator[Operation]:
        op = self.operations.start(op_id, title, total)
        try:
            yield op
        except web.HTTPError as e:
            self.operations.finish(op, error_message(e))
            raise
        except Exception as e:
            self.operations.finish(op, str(e) or type(e).__name__)
            raise
        self.operations.finish(op)


async def _kill_quietly(sandbox: Sandbox) -> None:
    with contextlib.suppress(SandforkError):
        await sandbox.async_kill()


def _http_error(error: SandforkError) -> web.HTTPError:
    """The engine's failure as this server's answer: its status (502 for a failed or missing
    engine) and its message."""
    status = error.status or 502
    return http_error(status if status < 500 else 502, str(error))
