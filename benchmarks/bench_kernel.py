"""Execute round trip of a trivial cell through the proxy kernel, against its peers.

Starts its own engine (state in a temporary directory, template from the shared cache) and a
"Python 3 (Sandfork)" kernel with jupyter_client, then times a trivial cell, ``1``
(execute_request to execute_reply and idle), ``--runs`` times through:

- the proxy kernel (ZMQ -> proxy -> engine WebSocket -> guest agent -> ipykernel), driven by a
  minimal client: send the request, decode the JSON of what comes back until the reply and
  idle;
- the engine's WebSocket channels reached directly (the same guest kernel, no proxy), driven by
  the same minimal client: the difference is what the proxy adds;
- the proxy kernel again, through jupyter_client's ``execute_interactive`` (clients such as
  nbclient and consoles verify, decode and dispatch every message: a cost of their own, on any
  kernel);
- the REST ``run_code`` path to the same code context;
- a local ipykernel reached directly with jupyter_client (no VM at all).

    .venv/bin/python benchmarks/bench_kernel.py --runs 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import zmq
from jupyter_client.manager import start_new_kernel
from jupyter_client.session import DELIM, Session
from scratch import scratch
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import clock, ms, timed

from conftest import EngineProcess
from sandfork.sdk import Sandbox


class Channels:
    """The engine's WebSocket channels of a code context, driven without the proxy."""

    def __init__(self, engine: EngineProcess, sandbox_id: str) -> None:
        url = engine.url.replace("http", "ws", 1)
        url += f"/v1/sandboxes/{sandbox_id}/repl/sessions/default/channels"
        self.loop = asyncio.new_event_loop()
        request = HTTPRequest(url, headers=engine.auth)
        self.ws = self.loop.run_until_complete(self._connect(request))
        self.session = uuid.uuid4().hex

    @staticmethod
    async def _connect(request: HTTPRequest) -> WebSocketClientConnection:
        return await websocket_connect(request)  # on self.loop, which runs this coroutine

    def execute(self) -> None:
        """Run ``1`` and wait for its execute_reply and idle status."""
        self.loop.run_until_complete(self._execute())

    async def _execute(self) -> None:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "session": self.session}
        header.update({"username": "bench", "date": "", "version": "5.3"})
        content = {"code": "1", "silent": False, "store_history": True}
        frame = {"channel": "shell", "header": header, "parent_header": {}, "metadata": {}}
        self.ws.write_message(json.dumps({**frame, "content": content, "buffers": []}))
        replied = idle = False
        while not (replied and idle):
            got = json.loads(await self.ws.read_message() or "{}")
            if got["parent_header"].get("msg_id") != msg_id:
                continue
            kind = got["header"]["msg_type"]
            replied = replied or kind == "execute_reply"
            idle = idle or (kind == "status" and got["content"]["execution_state"] == "idle")

    def close(self) -> None:
        self.ws.close()
        self.loop.close()


class KernelSockets:
    """A kernel's ZMQ sockets driven the way :class:`Channels` drives the WebSocket: the same
    request, and only JSON decoding of what comes back (no signature checks, as the channels
    carry none)."""

    def __init__(self, connection_file: str) -> None:
        info = json.loads(Path(connection_file).read_text())
        self.session = Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"])
        self.context = zmq.Context()
        base = f"{info['transport']}://{info['ip']}:"
        self.shell = self.context.socket(zmq.DEALER)
        self.shell.connect(base + str(info["shell_port"]))
        self.iopub = self.context.socket(zmq.SUB)
        self.iopub.connect(base + str(info["iopub_port"]))
        self.iopub.subscribe(b"")
        self.poller = zmq.Poller()
        self.poller.register(self.shell, zmq.POLLIN)
        self.poller.register(self.iopub, zmq.POLLIN)
        # A subscription takes effect a moment after connecting: wait until iopub delivers.
        while not self.iopub.poll(0):
            self.shell.send_multipart(
                self.session.serialize(self.session.msg("kernel_info_request"))
            )
            self.iopub.poll(1000)

    def execute(self) -> None:
        """Run ``1`` and wait for its execute_reply and idle status."""
        content = {"code": "1", "silent": False, "store_history": True}
        request = self.session.msg("execute_request", content)
        msg_id = request["header"]["msg_id"]
        self.shell.send_multipart(self.session.serialize(request))
        replied = idle = False
        while not (replied and idle):
            for sock, _ in self.poller.poll():
                frames = sock.recv_multipart()
                header, parent, _, body = frames[frames.index(DELIM) + 2 :][:4]
                if json.loads(parent).get("msg_id") != msg_id:
                    continue
                kind = json.loads(header)["msg_type"]
                replied = replied or kind == "execute_reply"
                idle = idle or (kind == "status" and json.loads(body)["execution_state"] == "idle")

    def close(self) -> None:
        self.context.destroy(linger=0)


def sandboxed_round_trips(engine: EngineProcess, runs: int) -> dict[str, list[float]]:
    """Proxy, channels and REST, interleaved so that the VM's drift hits them all alike."""
    sandbox = Sandbox.create(client=engine.client())
    os.environ["SANDFORK_SANDBOX_ID"] = sandbox.id  # the proxy attaches to this sandbox
    km, kc = start_new_kernel(kernel_name="sandfork", startup_timeout=120)
    del os.environ["SANDFORK_SANDBOX_ID"]
    channels = Channels(engine, sandbox.id)
    sockets = KernelSockets(km.connection_file)
    context = sandbox.create_code_context()
    paths: dict[str, Callable[[], object]] = {
        "proxy": sockets.execute,
        "channels": channels.execute,
        "jupyter_client": lambda: kc.execute_interactive("1", output_hook=lambda m: None),
        "rest": lambda: context.run_code("1"),
    }
    samples: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for run in range(runs + 5):  # the first five warm up
            for name, fn in paths.items():
                elapsed, _ = clock(fn)
                if run >= 5:
                    samples[name].append(elapsed)
    finally:
        channels.close()
        sockets.close()
        kc.stop_channels()
        km.shutdown_kernel()
        sandbox.kill()
    return samples


def local_round_trips(runs: int) -> list[float]:
    """``execute_interactive("1")`` on a local ipykernel: no VM, no engine."""
    km, kc = start_new_kernel()
    try:
        for _ in range(5):
            kc.execute_interactive("1", output_hook=lambda m: None)
        return timed(lambda: kc.execute_interactive("1", output_hook=lambda m: None), runs)
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()

    engine = EngineProcess(scratch("sandfork-bench-kernel-"))
    engine.start()
    os.environ["SANDFORK_API"], os.environ["SANDFORK_API_KEY"] = engine.url, engine.api_key
    try:
        sandboxed = sandboxed_round_trips(engine, args.runs)
    finally:
        engine.close()
    local = local_round_trips(args.runs)

    proxy, direct = sandboxed["proxy"], sandboxed["channels"]
    notebook = sandboxed["jupyter_client"]
    added = (statistics.median(proxy) - statistics.median(direct)) * 1000
    client_cost = (statistics.median(notebook) - statistics.median(proxy)) * 1000
    print(f"proxy kernel (minimal ZMQ client)  : {ms(proxy)}")
    print(f"engine channels direct (no proxy)  : {ms(direct)}")
    print(f"  the proxy adds                   : {added:7.1f} ms   target <= 5 ms")
    print(f"proxy kernel (jupyter_client)      : {ms(notebook)}")
    print(f"  jupyter_client adds              : {client_cost:7.1f} ms")
    print(f"REST run_code, same context        : {ms(sandboxed['rest'])}")
    print(f"local ipykernel (jupyter_client)   : {ms(local)}")


if __name__ == "__main__":
    main()
