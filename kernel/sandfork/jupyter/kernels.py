"""Sandfork kernels of a Jupyter server: which sandbox each one runs in, and starting new
kernels attached to a given sandbox (how restores and forks open notebooks).

A kernel is asked which sandbox it uses now, with a ``kernel_info_request`` on its control
channel (:mod:`sandfork.proxy_kernel.kernel_info`), each time it matters: the answer goes by
the Jupyter protocol, so it holds wherever the kernel runs and its connection file lies, and it
follows the kernel onto another sandbox (``%restore``, ``%rewind``, a move onto a checkpoint).

The proxy kernel binds its ports once it has attached: while nothing listens on the control
port the kernel is still starting (answered at once), and once something does, the kernel is
waited for as long as a hang allows, never for a guessed speed (a loaded machine may leave it
unscheduled for seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import weakref
from dataclasses import dataclass
from typing import Any

from jupyter_client.session import Session

from sandfork.jupyter.errors import http_error
from sandfork.proxy_kernel import kernel_info

KERNEL_NAME = "sandfork"
ATTACH_TIMEOUT = 120.0  # seconds a new kernel may take to reach its sandbox
_STARTING_POLL = 0.2  # seconds between looks at a starting kernel's control port


@dataclass(frozen=True)
class KernelSandbox:
    """The sandbox and code context a Sandfork kernel is attached to."""

    kernel_id: str
    sandbox_id: str
    context: str
    checkpoints: dict[str, Any]  # the kernel's: enabled, kept, lineage


# Each kernel's last answer, for a listing while it is too busy to answer in time.
_last_answer: weakref.WeakKeyDictionary[Any, KernelSandbox] = weakref.WeakKeyDictionary()


def is_sandfork_spec(kernel_spec_manager: Any, name: str) -> bool:
    """True for the ``sandfork`` kernelspec, or any kernelspec that runs the proxy kernel."""
    if name == KERNEL_NAME:
        return True
    try:
        argv = kernel_spec_manager.get_kernel_spec(name).argv
    except Exception:
        return False
    return "sandfork.proxy_kernel" in argv


def sandfork_kernel_names(kernel_spec_manager: Any) -> list[str]:
    """The names of the server's kernelspecs that are Sandfork kernels, sorted."""
    names = kernel_spec_manager.find_kernel_specs()
    return sorted(name for name in names if is_sandfork_spec(kernel_spec_manager, name))


def _kernel(kernel_manager: Any, kernel_id: str) -> Any:
    if kernel_id not in kernel_manager:
        raise http_error(404, f"no kernel {kernel_id[:128]!r}")
    return kernel_manager.get_kernel(kernel_id)


async def attached_sandbox(kernel_manager: Any, kernel_id: str) -> KernelSandbox:
    """The sandbox behind a kernel; 404 (no kernel), 400 (not Sandfork) or 409 (attaching)."""
    kernel = _kernel(kernel_manager, kernel_id)
    if not is_sandfork_spec(kernel_manager.kernel_spec_manager, kernel.kernel_name):
        raise http_error(
            400,
            f"kernel {kernel_id} runs {kernel.kernel_name!r}, not a Sandfork kernel: "
            "switch the notebook to 'Python 3 (Sandfork)'",
        )
    found = await _ask(kernel)
    if found is None:
        raise http_error(409, f"kernel {kernel_id} is still starting its sandbox; try again")
    return found


async def _ask(kernel: Any) -> KernelSandbox | None:
    """The sandbox the kernel says it uses, else None: it is starting (it serves no port
    yet), is gone, or hangs (see :func:`sandfork.proxy_kernel.kernel_info.ask`)."""
    # A session of its own: every client of a kernel manager shares the manager's session,
    # whose id is the ZMQ identity of its sockets, and of two asks at once (a listing and an
    # attach) the kernel's router answered one and lost the other's reply.
    session = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)
    client = kernel.client(session=session)
    client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        data = await kernel_info.ask(client)
    finally:
        client.stop_channels()
    if data is None:
        return None
    checkpoints = data.get("checkpoints") or {}
    return KernelSandbox(
        kernel.kernel_id, str(data["sandbox_id"]), str(data["context"]), checkpoints
    )


async def sandbox_kernels(kernel_manager: Any) -> dict[str, str]:
    """Sandbox id -> id of the live Sandfork kernel of this server attached to it."""
    specs = kernel_manager.kernel_spec_manager
    kernels = []
    for kernel_id in kernel_manager.list_kernel_ids():
        with contextlib.suppress(KeyError):
            kernel = kernel_manager.get_kernel(kernel_id)
            if is_sandfork_spec(specs, kernel.kernel_name):
                kernels.append(kernel)
    answers = await asyncio.gather(*(_ask_or_recall(kernel) for kernel in kernels))
    return {found.sandbox_id: found.kernel_id for found in answers if found is not None}


async def _ask_or_recall(kernel: Any) -> KernelSandbox | None:
    """The kernel's answer; if it gives none (restarting, hung), its last one."""
    found = await _ask(kernel)
    if found is None:
        return _last_answer.get(kernel)
    _last_answer[kernel] = found
    return found


async def start_attached(
    kernel_manager: Any, notebook_path: str, sandbox_id: str, context: str
) -> str:
    """Start a Sandfork kernel for ``notebook_path`` attached to ``sandbox_id``'s code context,
    the kernel then owning the sandbox (its shutdown kills it); returns once it is attached."""
    env = {
        **os.environ,
        "JPY_SESSION_NAME": notebook_path,
        "SANDFORK_SANDBOX_ID": sandbox_id,
        "SANDFORK_CONTEXT": context,
        "SANDFORK_OWN_SANDBOX": "1",
    }
    kernel_id: str = await kernel_manager.start_kernel(
        kernel_name=KERNEL_NAME, path=posixpath.dirname(notebook_path), env=env
    )
    try:
        await wait_attached(kernel_manager, kernel_id, (sandbox_id, context))
    except BaseException:
        await shutdown_quietly(kernel_manager, kernel_id)
        raise
    return kernel_id


async def wait_attached(
    kernel_manager: Any, kernel_id: str, target: tuple[str, str] | None = None
) -> None:
    """Return once the kernel has attached (to ``target``, if given: sandbox id, context);
    an HTTP error if it exits or takes longer than :data:`ATTACH_TIMEOUT`."""
    kernel = kernel_manager.get_kernel(kernel_id)
    deadline = asyncio.get_running_loop().time() + ATTACH_TIMEOUT
    # The kernel serves its ports, and so answers, once it has attached.
    while (found := await _ask(kernel)) is None:
        if not await kernel.is_alive():
            raise http_error(500, f"the Sandfork kernel {kernel_id} exited")
        if asyncio.get_running_loop().time() > deadline:
            raise http_error(504, f"the kernel {kernel_id} did not attach in time")
        await asyncio.sleep(_STARTING_POLL)
    if target not in (None, (found.sandbox_id, found.context)):
        attached = f"{found.sandbox_id} ({found.context})"
        raise http_error(500, f"the kernel {kernel_id} attached to {attached}, not {target}")


async def shutdown_quietly(kernel_manager: Any, kernel_id: str) -> None:
    """Shut a kernel down during cleanup, ignoring that it may already be gone."""
    with contextlib.suppress(Exception):
        await kernel_manager.shutdown_kernel(kernel_id, now=True)
