"""The proxy kernel's ZMQ sockets serve a client that connects again with the identity of a
connection the kernel has not yet seen close: every client a Jupyter kernel manager makes
shares the manager's session id as its ZMQ identity, so a client made right after another
one stopped comes back under the same identity."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import zmq

from sandfork.proxy_kernel.sockets import KernelSockets

HANG_S = 30.0  # bounds a hang, not a speed: the message arrives at once or never


def _free_ports(count: int) -> list[int]:
    held = [socket.socket() for _ in range(count)]
    for sock in held:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in held]
    for sock in held:
        sock.close()
    return ports


@pytest.fixture
def kernel_sockets() -> Iterator[KernelSockets]:
    names = ["shell", "control", "stdin", "iopub", "hb"]
    connection = {"transport": "tcp", "ip": "127.0.0.1", "key": "k" * 32}
    connection.update(
        {f"{name}_port": port for name, port in zip(names, _free_ports(5), strict=True)}
    )
    sockets = KernelSockets(connection, sent=lambda channel: None)
    yield sockets
    sockets.close()


def _received(router: zmq.Socket[bytes]) -> list[bytes] | None:
    if not router.poll(HANG_S * 1000):
        return None
    return router.recv_multipart()


@pytest.mark.parametrize("channel", ["shell", "control", "stdin"])
def test_a_client_back_under_a_live_connections_identity_is_served(
    kernel_sockets: KernelSockets, channel: str
) -> None:
    router = kernel_sockets.sockets[channel]
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
    context = zmq.Context()
    try:
        first, second = (context.socket(zmq.DEALER) for _ in range(2))
        for client in (first, second):
            client.linger = 0
            client.setsockopt(zmq.IDENTITY, b"one-session")
        first.connect(endpoint)
        first.send(b"from the first client")
        assert _received(router) == [b"one-session", b"from the first client"]

        second.connect(endpoint)
        second.send(b"from the second client")
        assert _received(router) == [b"one-session", b"from the second client"]
        router.send_multipart([b"one-session", b"reply"])
        assert second.poll(HANG_S * 1000), "the reply went to the old connection"
        assert second.recv() == b"reply"
    finally:
        context.destroy(linger=0)
