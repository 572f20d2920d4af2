"""How long the guest agent waits for a kernel to start: as long as it keeps working (up to a
cap), and no longer than the stall bound once it uses no CPU.

A fixed bound failed the first boot of a template on a loaded machine under TCG (a kernel
importing IPython at a third of a core took past 120 s), while a kernel that is stuck must
still fail soon. The agent's own kernel process is started here, on the host, with a
``sitecustomize`` on its path that either blocks (no CPU) or works until the test lets it go.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import zmq.asyncio

from sandfork.agent.kernel import KernelProcess
from sandfork.agent.protocol import AgentError

STUCK = """\
import select, sys
if "ipykernel_launcher" in sys.orig_argv:
    select.select([], [], [])  # blocks for good, using no CPU
"""

SLOW_TO_ANSWER = """\
import sys, time
if "ipykernel_launcher" in sys.orig_argv:
    from ipykernel import kernelbase
    answer = kernelbase.Kernel.kernel_info_request
    async def slow(self, *args, **kwargs):
        time.sleep(0.5)  # each answer takes five first probe intervals
        return await answer(self, *args, **kwargs)
    kernelbase.Kernel.kernel_info_request = slow
"""

WORKING = """\
import os, sys
if "ipykernel_launcher" in sys.orig_argv:
    while os.path.exists({gate!r}):
        pass  # busy: its CPU time grows
"""


@pytest_asyncio.fixture
async def start_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[object]:
    kernels: list[KernelProcess] = []
    context = zmq.asyncio.Context()

    async def start(site_code: str) -> KernelProcess:
        site = tmp_path / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(site_code)
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
        )
        kernel = KernelProcess("k", str(tmp_path), context, lambda *_: None, lambda *_: None)
        kernels.append(kernel)
        await kernel.start()
        return kernel

    yield start
    for kernel in kernels:
        await kernel.kill()
    context.term()


@pytest.mark.asyncio
async def test_a_kernel_that_uses_no_cpu_is_stuck(start_kernel) -> None:  # type: ignore[no-untyped-def]
    kernel = await start_kernel(STUCK)
    with pytest.raises(AgentError, match="used no CPU for 1 s while starting") as caught:
        await kernel.wait_ready(stall=1.0, cap=600.0)
    assert caught.value.kind == "Timeout"


@pytest.mark.asyncio
async def test_a_kernel_still_working_past_the_stall_bound_is_waited_for(  # type: ignore[no-untyped-def]
    start_kernel, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    kernel = await start_kernel(WORKING.format(gate=str(gate)))
    ready = asyncio.ensure_future(kernel.wait_ready(stall=2.0, cap=600.0))
    # Three stall periods of work: a fixed 2 s bound would have given up by now.
    done, _ = await asyncio.wait([ready], timeout=6.0)
    assert not done, ready.exception() if ready.done() else None
    gate.unlink()
    await ready


@pytest.mark.asyncio
async def test_a_kernel_slower_to_answer_than_the_probe_interval_becomes_ready(  # type: ignore[no-untyped-def]
    start_kernel,
) -> None:
    """Any probe's answer means ready: waiting for the latest probe's own answer, each
    arriving after the next probe went, never ended (a template's first boot failed so on a
    loaded machine under TCG)."""
    kernel = await start_kernel(SLOW_TO_ANSWER)
    await kernel.wait_ready(stall=60.0, cap=120.0)  # bounds for a hang, not a speed
