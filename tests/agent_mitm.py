"""A hostile guest agent for the engine, without a fake: the real engine, the real VM and its
real agent, with this relay on the link between them.

Guest code runs as root and can take over the agent's port (``test_hostile_input`` does so
from inside a guest); to forge replies to exactly the requests a test names, the relay sits
where the engine connects instead: the engine is stopped (its VMs run on), the sandbox's
agent socket is moved aside and this relay listens in its place, and the restarted engine
adopts the VM through it. Every frame is relayed as it is, unless the test has the relay
answer the next request of an operation itself (:meth:`AgentInTheMiddle.forge`) or write
frames of its own towards the engine (:meth:`AgentInTheMiddle.inject`).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from conftest import EngineProcess

Reply = Callable[[int], bytes]
"""Makes the bytes the relay sends for a request, given the request's id."""


def reply(body: dict[str, Any]) -> Reply:
    """A reply frame: ``body`` (``ok`` and ``result`` or ``error``) under the request's id."""
    return lambda req_id: json.dumps({"id": req_id, **body}).encode() + b"\n"


def result(value: Any) -> Reply:
    """A successful reply carrying ``value`` as its result."""
    return reply({"ok": True, "result": value})


class AgentInTheMiddle:
    """The relay on one sandbox's agent link (see the module's docstring)."""

    def __init__(self, engine: EngineProcess, sandbox_id: str) -> None:
        self.engine = engine
        self.path = engine.ram_dir / f"{sandbox_id}.agent"
        self.real = self.path.with_name(self.path.name + ".real")
        self._forged: dict[str, list[Reply]] = {}
        self._to_engine: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.requests: list[dict[str, Any]] = []  # every request the engine sent, in order

    def start(self) -> None:
        """Put the relay on the link: the engine restarts and adopts the VM through it."""
        self.engine.stop()
        self.path.rename(self.real)
        self._listener.bind(str(self.path))
        self._listener.listen(4)
        threading.Thread(target=self._accept, daemon=True).start()
        self.engine.start()

    def forge(self, op: str, answer: Reply) -> None:
        """Answer the next request of ``op`` with ``answer`` (the agent never sees it)."""
        self._forged.setdefault(op, []).append(answer)

    def inject(self, data: bytes) -> None:
        """Write ``data`` (whole lines) to the engine, between two frames of the agent."""
        assert self._to_engine is not None, "the engine is not connected"
        with self._send_lock:
            self._to_engine.sendall(data)

    def _accept(self) -> None:
        while True:
            try:
                engine_side, _ = self._listener.accept()
            except OSError:
                return
            agent_side = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            agent_side.connect(str(self.real))
            self._to_engine = engine_side
            threading.Thread(
                target=self._requests, args=(engine_side, agent_side), daemon=True
            ).start()
            threading.Thread(
                target=self._replies, args=(agent_side, engine_side), daemon=True
            ).start()

    def _requests(self, engine_side: socket.socket, agent_side: socket.socket) -> None:
        for line in _lines(engine_side):
            frame = json.loads(line)
            self.requests.append(frame)
            forged = self._forged.get(frame.get("op"))
            if forged:
                self.inject(forged.pop(0)(frame["id"]))
            else:
                agent_side.sendall(line)
        agent_side.close()

    def _replies(self, agent_side: socket.socket, engine_side: socket.socket) -> None:
        for line in _lines(agent_side):
            with self._send_lock:
                engine_side.sendall(line)
        engine_side.close()

    def close(self) -> None:
        """Stop listening (the sandbox is killed by its test)."""
        self._listener.close()


def _lines(sock: socket.socket) -> Iterator[bytes]:
    """The newline-ended lines read from ``sock`` until it closes."""
    buffer = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        if b"\n" not in chunk:
            continue
        *lines, rest = buffer.split(b"\n")
        buffer = bytearray(rest)
        for line in lines:
            yield bytes(line) + b"\n"
