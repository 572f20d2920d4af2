"""``sandfork lab``: JupyterLab in a child process that Ctrl-C shuts down cleanly, kernels and
their sandboxes included, followed by a check that none of its kernels is left.

Jupyter Server only shuts its kernels down when it stops through its own handler (SIGTERM, or
Ctrl-C confirmed on a terminal); a plain SIGINT ends it with a ``KeyboardInterrupt`` and leaves
every kernel running. So JupyterLab runs in its own process group (the terminal's Ctrl-C reaches
only this process), and a Ctrl-C, SIGTERM or SIGHUP here becomes a SIGTERM there; a second one
kills it. This process is the subreaper of JupyterLab's descendants: a Sandfork kernel that
outlives it becomes our child, is sent SIGTERM (it kills its own sandbox) and, failing that,
SIGKILL, after which its sandbox (which it named, asked over the Jupyter protocol before it was
ended) is killed here. JupyterLab gets SIGTERM if this process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from jupyter_client.asynchronous import AsyncKernelClient

from sandfork.proxy_kernel import kernel_info
from sandfork.sdk import Client, Sandbox, SandforkError

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_KERNEL_EXIT_TIMEOUT = 15.0  # seconds a leftover kernel has to end after SIGTERM
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _child_setup(parent: int) -> Callable[[], None]:
    def setup() -> None:  # in the child, before exec
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return setup


def run_lab(
    argv: list[str], env: dict[str, str], client: Client, say: Callable[[str], None]
) -> int:
    """Run JupyterLab (``argv``) until it exits or is stopped; returns its exit status.

    ``client`` reaches the engine, for the sandboxes of kernels that had to be killed; ``say``
    reports progress.
    """
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    lab = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        process_group=0,
        preexec_fn=_child_setup(os.getpid()),
    )
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            say("killing JupyterLab")
            lab.kill()
            return
        stopping = True
        say("stopping JupyterLab and its kernels (again to kill it)…")
        lab.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNALS}
    try:
        status = lab.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for line in end_leftover_kernels(client):
        say(line)
    return status if status >= 0 else 128 - status  # killed by a signal: as a shell says


def leftover_kernels() -> dict[int, str]:
    """Sandfork kernels that are children of this process (orphans it reaped): pid ->
    connection file."""
    found: dict[int, str] = {}
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and "sandfork.proxy_kernel" in argv and "-f" in argv[:-1]:
            found[int(proc.name)] = argv[argv.index("-f") + 1]
    return found


def end_leftover_kernels(client: Client) -> list[str]:
    """End the Sandfork kernels JupyterLab left behind, and their own sandboxes; returns what
    was done, one line each."""
    kernels = leftover_kernels()
    owned = asyncio.run(_owned_sandboxes(kernels)) if kernels else {}
    done: list[str] = []
    for pid in kernels:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # the kernel kills its own sandbox
    waiting = set(kernels)
    deadline = time.monotonic() + _KERNEL_EXIT_TIMEOUT
    while waiting:
        for pid in list(waiting):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            waiting.discard(pid)
        if waiting and time.monotonic() > deadline:
            for pid in waiting:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            break
        if waiting:
            time.sleep(0.05)  # polling children we cannot select on
    for pid in kernels:
        done.append(f"ended kernel {pid} that JupyterLab left running")
        if pid in owned:
            done.extend(_kill_owned_sandbox(client, owned[pid]))
    return done


async def _owned_sandboxes(kernels: dict[int, str]) -> dict[int, str]:
    """pid -> the sandbox each kernel (pid -> connection file) says it owns, if it does."""
    answers = await asyncio.gather(*(_owned_sandbox(path) for path in kernels.values()))
    return {pid: sandbox_id for pid, sandbox_id in zip(kernels, answers, strict=True) if sandbox_id}


async def _owned_sandbox(connection_file: str) -> str | None:
    client = AsyncKernelClient(connection_file=connection_file)
    try:
        client.load_connection_file()
    except (OSError, ValueError):
        return None
    client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        found = await kernel_info.ask(client)
    finally:
        client.stop_channels()
    return str(found["sandbox_id"]) if found and found.get("owned") else None


def _kill_owned_sandbox(client: Client, sandbox_id: str) -> list[str]:
    """Kill the sandbox a dead kernel owned, if it is still there (and not persistent)."""
    try:
        sandbox = Sandbox.get(sandbox_id, client)
        if sandbox.persistent:
            return []
        sandbox.kill()
    except SandforkError:
        return []
    return [f"killed sandbox {sandbox.id}"]
