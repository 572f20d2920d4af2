"""How the Jupyter server and ``sandfork lab`` ask a kernel which sandbox it uses
(:func:`sandfork.proxy_kernel.kernel_info.ask`), against a stand-in kernel on loopback: a
kernel that serves its control port is waited for, however slowly it answers (a loaded machine
leaves it unscheduled for seconds: a 5 s bound made attached kernels look "still starting"),
and one that serves no port yet is reported at once."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session

from sandfork.jupyter import kernels
from sandfork.proxy_kernel import kernel_info

KEY = b"secret"
SLOWER_THAN_THE_OLD_BOUND_S = 6.0
ANSWER = kernel_info.describe("sbx_0123456789abcdef", "default", True, {})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _client(control_port: int) -> AsyncKernelClient:
    client = AsyncKernelClient(
        ip="127.0.0.1", transport="tcp", control_port=control_port, session=Session(key=KEY)
    )
    client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    return client


@pytest_asyncio.fixture
async def slow_kernel() -> AsyncIterator[int]:
    """A kernel's control port whose ``kernel_info_reply`` takes longer than 5 s; its port."""
    async with _kernel(SLOWER_THAN_THE_OLD_BOUND_S) as port:
        yield port


@pytest_asyncio.fixture
async def quick_kernel() -> AsyncIterator[int]:
    """A kernel's control port that answers at once; its port."""
    async with _kernel(0.0) as port:
        yield port


@contextlib.asynccontextmanager
async def _kernel(delay: float) -> AsyncIterator[int]:
    context = zmq.asyncio.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    session = Session(key=KEY)

    async def serve() -> None:
        while True:
            frames = await router.recv_multipart()
            idents, message = session.feed_identities(frames)
            request = session.deserialize(message)
            await asyncio.sleep(delay)
            content = {"status": "ok", kernel_info.KEY: ANSWER}
            session.send(router, kernel_info.REPLY, content, parent=request, ident=idents)

    task = asyncio.create_task(serve())
    try:
        yield port
    finally:
        task.cancel()
        router.close(linger=0)
        context.term()


@pytest.mark.asyncio
async def test_a_kernel_serving_its_port_is_waited_for_however_slow(slow_kernel: int) -> None:
    client = _client(slow_kernel)
    try:
        assert await kernel_info.ask(client) == ANSWER
    finally:
        client.stop_channels()


@pytest.mark.asyncio
async def test_a_kernel_serving_no_port_yet_is_reported_at_once() -> None:
    client = _client(_free_port())  # nothing listens there: the kernel is still attaching
    try:
        # A long timeout would be waited out in full if the port were not looked at first.
        found = await asyncio.wait_for(kernel_info.ask(client, timeout=3600.0), 60.0)
        assert found is None
    finally:
        client.stop_channels()


@pytest.mark.asyncio
async def test_two_asks_at_once_through_one_kernel_manager_are_both_answered(
    quick_kernel: int,
) -> None:
    """The side panel's listing and a restore's attach ask one new kernel at once, through
    the server's one manager of it: each gets its answer (sharing the manager's session,
    whose id is their sockets' identity, one of the two waited out its whole bound)."""
    manager = AsyncKernelManager(session=Session(key=KEY))
    manager.load_connection_info(
        {"ip": "127.0.0.1", "transport": "tcp", "control_port": quick_kernel}
    )
    answers = await asyncio.wait_for(
        asyncio.gather(*(kernels._ask(manager) for _ in range(3))),
        30.0,  # a hang's bound
    )
    assert [a.sandbox_id if a else None for a in answers] == [ANSWER["sandbox_id"]] * 3
