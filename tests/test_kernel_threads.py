"""The proxy kernel runs on one event loop: its process has its main thread and ZMQ's own
threads, and no cell starts another (no thread hop per engine call, no SDK loop thread)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel

from conftest import EngineProcess
from kernel_client import execute, sandbox_id
from sandfork.sdk import Snapshot

pytestmark = [pytest.mark.vm, pytest.mark.any_backend, pytest.mark.usefixtures("kernel_engine_env")]

ZMQ_THREAD = "ZMQbg/"  # how libzmq names its I/O and reaper threads


def _threads(pid: int) -> dict[int, str]:
    """The threads of process ``pid``: id -> name."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[int(task.name)] = (task / "comm").read_text().strip()
        except FileNotFoundError:  # it ended meanwhile: it is not there
            continue
    return found


@pytest.fixture
def kernel(engine: EngineProcess) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    km, kc = start_new_kernel(kernel_name="sandfork", startup_timeout=120)
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        attached = sandbox_id(km)
        km.shutdown_kernel()
        for snapshot in Snapshot.list(sandbox_id=attached, client=engine.client()):
            snapshot.delete()


def test_cells_start_no_thread_in_the_proxy_kernel(
    kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    km, kc = kernel
    pid = km.provisioner.process.pid  # type: ignore[union-attr]
    execute(kc, "x = 0")  # warm-up: the first cell
    threads = _threads(pid)
    others = {tid: name for tid, name in threads.items() if tid != pid}
    assert others and all(name.startswith(ZMQ_THREAD) for name in others.values()), threads

    # Cells, with a checkpoint after each (snapshot, listing, retention), and magics: each
    # one's engine calls are awaited on the kernel's loop.
    cells = ["%checkpoints on 2", "x = 1", "x = 2", "x = 3", "%sandbox", "%snapshot"]
    for code in cells:
        messages = execute(kc, code)
        assert messages[-1]["content"]["status"] == "ok", messages[-1]
        assert _threads(pid) == threads, f"after {code!r}"
