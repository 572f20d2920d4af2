"""Time travel in a notebook's kernel: the checkpoint history after every cell, rewinding to
before a given cell (as JupyterLab's "Rewind kernel to before this cell" asks), named
checkpoints outliving retention, and an idle kernel's sandbox hibernating and waking on the
next request with its state. Real kernels, engine and VMs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel

from conftest import EngineProcess
from kernel_client import execute, kernel_sandbox, sandbox_id, stdout, wait_status
from sandfork.proxy_kernel.checkpoints import CellCheckpoints
from sandfork.sdk import Client, NotFoundError, Sandbox, Snapshot

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kernel_engine_env"), pytest.mark.any_backend]

NAMES = ("a", "b", "c", "d", "e")
PRESENT = f"print(sorted(k for k in {NAMES!r} if k in globals()))"


@contextlib.contextmanager
def _started(
    engine: EngineProcess, *options: str
) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    """A Sandfork kernel (with ``options``); its checkpoints are deleted after it."""
    km, kc = start_new_kernel(
        kernel_name="sandfork", startup_timeout=120, extra_arguments=list(options)
    )
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
        for snapshot in Snapshot.list(client=engine.client()):
            if "kernel_lineage" in snapshot.metadata:
                snapshot.delete()


@pytest.fixture
def kernel(engine: EngineProcess) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    with _started(engine) as started:
        yield started


def _silent(kc: BlockingKernelClient, code: str) -> dict[str, object]:
    """Send ``code`` as JupyterLab's toolbar and menus do (silent); return the reply."""
    messages = execute(kc, code, silent=True, store_history=False)
    content: dict[str, object] = messages[-1]["content"]
    return content


def test_a_checkpoint_after_every_cell_and_rewind(
    engine: EngineProcess, kernel: tuple[KernelManager, BlockingKernelClient]
) -> None:
    _, kc = kernel
    assert "checkpoints after every cell: on" in stdout(execute(kc, "%checkpoints on"))
    for i, code in enumerate(["a = 1", "b = 2", "c = 3", "a = 10"], start=1):
        execute(kc, code, cell_id=f"cell-{i}")
    # The next request waits for the last cell's checkpoint (taken after its reply).
    assert "on (the last 20 kept)" in stdout(execute(kc, "%checkpoints"))
    taken = [s for s in Snapshot.list(client=engine.client()) if "cell_id" in s.metadata]
    base = taken.pop()  # taken by %checkpoints on: the state before the first cell
    assert base.metadata["cell_id"] == "" and base.metadata["previous_checkpoint"] == ""
    assert [s.metadata["cell_id"] for s in taken] == ["cell-4", "cell-3", "cell-2", "cell-1"]
    assert [s.metadata["previous_checkpoint"] for s in taken] == [s.id for s in [*taken[1:], base]]
    counts = [int(s.metadata["execution_count"]) for s in taken]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == 4
    assert {len(s.metadata["source_sha256"]) for s in taken} == {64}
    # Before the last two cells (c = 3, a = 10): a is 1, b exists, c does not.
    rewound = execute(kc, "%rewind 2\nprint(a, 'b' in dir(), 'c' in dir())")
    assert stdout(rewound).splitlines()[-1] == "1 True False"
    too_far = execute(kc, "%rewind 9")
    assert "needs 10" in too_far[-1]["content"]["evalue"]
    assert "off" in stdout(execute(kc, "%checkpoints off"))
    execute(kc, "d = 4", cell_id="cell-5")
    after = [s for s in Snapshot.list(client=engine.client()) if "cell_id" in s.metadata]
    # The base, four cells, the rest of the %rewind cell; none with checkpoints off.
    assert len(after) == 6


def test_rewind_to_before_a_cell_follows_the_kernels_own_history(
    kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    km, kc = kernel
    assert _silent(kc, "%checkpoints on 10")["status"] == "ok"
    assert kernel_sandbox(km)["checkpoints"]["enabled"] is True
    for i, name in enumerate(NAMES, start=1):
        execute(kc, f"{name} = {i}", cell_id=f"cell-{i}")

    # Before cell 3: what cells 1 and 2 made is there, what cells 3 to 5 made is gone.
    reply = _silent(kc, "%rewind --cell cell-3")
    assert reply["status"] == "ok", reply
    assert stdout(execute(kc, PRESENT)).strip() == "['a', 'b']"

    # Cell 3 runs again, changed; two cells back (that cell and a print) is before it again,
    # not cell 5's state, which is newer but from the abandoned future.
    execute(kc, "c = 30", cell_id="cell-3")
    assert stdout(execute(kc, "print(c)")).strip() == "30"
    assert _silent(kc, "%rewind 2")["status"] == "ok"
    assert stdout(execute(kc, PRESENT)).strip() == "['a', 'b']"

    # Before the first cell: the checkpoint taken when checkpoints were turned on.
    assert _silent(kc, "%rewind --cell cell-1")["status"] == "ok"
    assert stdout(execute(kc, PRESENT)).strip() == "[]"

    unknown = _silent(kc, "%rewind --cell cell-9")
    assert unknown["status"] == "error"
    assert "no checkpoint before cell cell-9" in str(unknown["evalue"])
    usage = _silent(kc, "%rewind --cell")
    assert "usage: %rewind [N] | %rewind --cell ID" in str(usage["evalue"])


def test_old_checkpoints_go_and_named_ones_stay(client: Client) -> None:
    checkpoints = CellCheckpoints(enabled=True, kept=2)
    with Sandbox.create(client=client) as sandbox:
        taken = []
        for i in range(4):
            checkpoints.started(f"m{i}", f"x = {i}", {"cellId": f"c{i}"})
            metadata = checkpoints.finished(f"m{i}", b'{"execution_count": %d}' % i)
            assert metadata is not None
            taken.append(asyncio.run(checkpoints.take(sandbox, metadata)).id)
            if i == 0:
                Snapshot.get(taken[0], client=client).rename("keep me")
        kept = {s.id for s in asyncio.run(checkpoints.listed(sandbox))}
        assert kept == {taken[0], taken[2], taken[3]}  # the named one and the newest two
        with pytest.raises(NotFoundError):
            Snapshot.get(taken[1], client=client)
        # The history runs back through the named one; the collected link ends it.
        assert [s.id for s in asyncio.run(checkpoints.history(sandbox))] == [taken[3], taken[2]]
        for snapshot in asyncio.run(checkpoints.listed(sandbox)):
            snapshot.delete()


@pytest.mark.vm_only  # a VM's captures read the pages written since the previous one
def test_a_long_running_kernel_keeps_its_sandbox_through_its_checkpoints(
    engine: EngineProcess,
) -> None:
    # 500 MB written since the sandbox started; each cell then changes 1 MB.
    with _started(engine) as (km, kc):
        execute(kc, "import numpy as np\nbig = np.ones(500_000_000, np.uint8)")
        assert _silent(kc, "%checkpoints on")["status"] == "ok"
        before = sandbox_id(km)
        execute(kc, "big[:1_000_000] = 2", cell_id="cell-1")
        execute(kc, "big[1_000_000:2_000_000] = 3", cell_id="cell-2")
        assert _silent(kc, "%checkpoints off")["status"] == "ok"  # waits for cell 2's
        assert sandbox_id(km) == before
        expected = 2 * 1_000_000 + 3 * 1_000_000 + 498_000_000
        assert stdout(execute(kc, "print(int(big.sum()))")).strip() == str(expected)
        by_cell = {s.metadata.get("cell_id"): s for s in Snapshot.list(client=engine.client())}
        # The first checkpoint stored the 500 MB; the cells' stored what they changed.
        assert by_cell[""].size_bytes > 400 * 2**20
        for cell in ("cell-1", "cell-2"):
            assert by_cell[cell].sandbox_id == before
            assert by_cell[cell].size_bytes < 100 * 2**20, by_cell[cell]


def test_an_idle_kernel_hibernates_and_the_next_request_wakes_it(
    engine: EngineProcess, kernel: tuple[KernelManager, BlockingKernelClient]
) -> None:
    km, kc = kernel
    execute(kc, "import numpy as np\nx = 42\nbig = np.arange(5_000_000)")
    assert "after 2 s" in stdout(execute(kc, "%hibernate after 2"))
    sandbox = sandbox_id(km)
    wait_status(engine, sandbox, "hibernated", 300)
    assert engine.sandbox_gone(sandbox)  # its VM (or container) is gone
    assert km.is_alive()

    # A completion wakes it (and is answered by the guest); then its variables are there.
    kc.complete("bi", 2)
    reply = kc.get_shell_msg(timeout=600)  # a wake: minutes on a loaded machine
    assert reply["msg_type"] == "complete_reply" and "big" in reply["content"]["matches"]
    assert Sandbox.get(sandbox, engine.client()).status == "running"
    assert stdout(execute(kc, "print(x, int(big.sum()))")).strip() == (
        f"42 {sum(range(5_000_000))}"
    )

    # It sleeps again once idle; an execute wakes it the same way.
    wait_status(engine, sandbox, "hibernated", 300)
    assert stdout(execute(kc, "print(x + 1)")).strip() == "43"
    assert "off" in stdout(execute(kc, "%hibernate off"))
    assert "usage" in str(_silent(kc, "%hibernate after soon")["evalue"])


def test_the_kernel_info_names_its_lineage(
    kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    km, kc = kernel
    checkpoints = kernel_sandbox(km)["checkpoints"]
    assert checkpoints["enabled"] is False and len(checkpoints["lineage"]) == 32
    assert "on (the last 3 kept)" in stdout(execute(kc, "%checkpoints on 3"))
    assert kernel_sandbox(km)["checkpoints"]["kept"] == 3
