"""The proxy kernel "Python 3 (Sandfork)" under jupyter_kernel_test's protocol suite, plus
stdin, interrupt, restart and shutdown, against a real engine and real sandboxes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import jupyter_kernel_test
import pytest
import zmq
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import start_new_kernel

from conftest import EngineProcess
from kernel_client import execute as _execute
from kernel_client import stdout as _stdout
from sandfork.protocol import SANDBOX_ID
from sandfork.sdk import Sandbox

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kernel_engine_env"), pytest.mark.any_backend]


class SandforkKernelTests(jupyter_kernel_test.KernelTests):
    """The generic suite: kernel info, execute, streams, errors, completion, inspection..."""

    kernel_name = "sandfork"
    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]  # noqa: RUF012
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]  # noqa: RUF012
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]  # noqa: RUF012
    invalid_code_samples = ["import = 7q"]  # noqa: RUF012
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('boom')"
    code_execute_result = [{"code": "1+2+3", "result": "6"}]  # noqa: RUF012
    code_display_data = [  # noqa: RUF012
        {
            "code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
            "mime": "text/html",
        },
        {
            "code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
            "mime": "text/latex",
        },
    ]
    code_history_pattern = "1?2*"
    # Not "range": IPython numbers the current session 0 in a range reply but not in a tail
    # reply, so the suite's range check fails on a plain local ipykernel too; see
    # test_sandfork_history_range.
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    def execute_helper(self, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], list[Any]]:
        """The suite's own, without its speed bounds: after the reply it waits 1 s for the
        busy status and 0.1 s for each message up to idle, which a proxied kernel on a loaded
        machine can miss. Every message it waits for there comes: a longer wait costs
        nothing unless something is wrong."""
        channel = self.kc.iopub_channel
        get_msg = channel.get_msg

        def patient(timeout: float | None = None) -> dict[str, Any]:
            return get_msg(timeout=None if timeout is None else max(timeout, 120.0))

        channel.get_msg = patient  # type: ignore[method-assign]
        try:
            return super().execute_helper(*args, **kwargs)
        finally:
            channel.get_msg = get_msg  # type: ignore[method-assign]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        # Jedi's first inference takes about 100 s in a TCG guest; IPython's own completer
        # answers at once and the complete_request/reply relay is the same.
        cls.kc.execute_interactive("%config Completer.use_jedi = False", timeout=60)

    def test_sandfork_kernel_info_is_the_guest_kernel(self) -> None:
        self.flush_channels()
        reply = self.kc.kernel_info(reply=True, timeout=60)
        assert reply["content"]["language_info"]["version"].startswith("3.11")
        assert reply["content"]["implementation"] == "ipython"

    def test_sandfork_kernel_info_names_the_sandbox_even_while_a_cell_runs(self) -> None:
        self.flush_channels()
        shell = self.kc.kernel_info(reply=True, timeout=60)["content"]
        attached = shell["sandfork"]
        assert re.fullmatch(SANDBOX_ID, attached["sandbox_id"]) and attached["owned"] is True
        # A cell waiting for input keeps the guest busy: the proxy answers on control itself.
        msg_id = self.kc.execute("input('wait')", allow_stdin=True)
        assert self.kc.get_stdin_msg(timeout=60)["msg_type"] == "input_request"
        request = self.kc.session.msg("kernel_info_request")
        self.kc.control_channel.send(request)
        reply = self.kc.control_channel.get_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == request["header"]["msg_id"]
        assert reply["content"] == shell  # the guest's info, as last relayed, and the sandbox
        self.kc.input("done")
        assert self.kc.get_shell_msg(timeout=60)["parent_header"]["msg_id"] == msg_id

    def test_sandfork_runs_in_the_guest(self) -> None:
        self.flush_channels()
        messages = _execute(self.kc, "import socket; print(open('/etc/motd').read())")
        assert "Sandfork sandbox" in _stdout(messages)

    def test_sandfork_input_over_stdin(self) -> None:
        self.flush_channels()
        msg_id = self.kc.execute("name = input('who? '); print('hi', name)", allow_stdin=True)
        request = self.kc.get_stdin_msg(timeout=60)
        assert request["msg_type"] == "input_request"
        assert request["parent_header"]["msg_id"] == msg_id
        assert request["content"]["prompt"] == "who? "
        self.kc.input("sandfork")
        reply = self.kc.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "ok"
        out = ""
        while "hi sandfork" not in out:
            msg = self.kc.get_iopub_msg(timeout=60)
            if msg["msg_type"] == "stream":
                out += msg["content"]["text"]

    def test_sandfork_interrupt_stops_the_guest_cell(self) -> None:
        self.flush_channels()
        code = "import time\nprint('running', flush=True)\nfor _ in range(600): time.sleep(0.1)"
        msg_id = self.kc.execute(code)
        while True:  # until the cell's code runs (a SIGINT before that is not its)
            msg = self.kc.get_iopub_msg(timeout=60)
            if msg["msg_type"] == "stream" and msg["parent_header"]["msg_id"] == msg_id:
                break
        self.km.interrupt_kernel()
        # Uninterrupted, the cell would end after its minute with status "ok".
        reply = self.kc.get_shell_msg(timeout=300)
        while reply["parent_header"]["msg_id"] != msg_id:
            reply = self.kc.get_shell_msg(timeout=300)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"

    def test_sandfork_history_range(self) -> None:
        self.flush_channels()
        for code in ("a = 'first'", "b = 'second'"):
            _execute(self.kc, code)
        tail = self.kc.history(hist_access_type="tail", n=2, raw=True, output=False, reply=True)
        session, start, code = tail["content"]["history"][0]
        assert code == "a = 'first'"
        for asked in (session, 0):  # the absolute number, or 0 for the current session
            reply = self.kc.history(
                hist_access_type="range",
                session=asked,
                start=start,
                stop=start + 2,
                raw=True,
                output=False,
                reply=True,
            )
            history = reply["content"]["history"]
            assert [(line, source) for _, line, source in history] == [
                (start, "a = 'first'"),
                (start + 1, "b = 'second'"),
            ]

    def test_sandfork_heartbeat_beats(self) -> None:
        """The kernel echoes a heartbeat (asked directly: jupyter_client's own beat counts a
        late echo, on a loaded machine, as a missed one)."""
        assert self.kc.is_alive()
        context = zmq.Context.instance()
        with context.socket(zmq.REQ) as hb:
            hb.linger = 0
            hb.connect(f"{self.kc.transport}://{self.kc.ip}:{self.kc.hb_port}")
            hb.send(b"ping")
            assert hb.poll(300_000), "no heartbeat echo"
            assert hb.recv() == b"ping"


def test_restart_keeps_the_sandbox_and_shutdown_kills_it(engine: EngineProcess) -> None:
    km, kc = start_new_kernel(kernel_name="sandfork", startup_timeout=120)
    try:
        kc.wait_for_ready(timeout=60)
        messages = _execute(kc, "import socket; x = 5; print(socket.gethostname())")
        assert messages[-1]["content"]["status"] == "ok"
        before = {s.id for s in Sandbox.list(engine.client()) if s.status == "running"}
        km.restart_kernel()
        kc.wait_for_ready(timeout=60)
        messages = _execute(kc, "x")
        assert messages[-1]["content"]["ename"] == "NameError"
        after = {s.id for s in Sandbox.list(engine.client()) if s.status == "running"}
        assert after == before  # the restart made no new sandbox
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    remaining = {s.id for s in Sandbox.list(engine.client())}
    assert not before & remaining  # the kernel's own sandbox is gone


@contextlib.contextmanager
def _attached_kernel(sandbox_id: str) -> Iterator[BlockingKernelClient]:
    """A Sandfork kernel attached to an existing sandbox; shut down on exit."""
    os.environ["SANDFORK_SANDBOX_ID"] = sandbox_id
    try:
        km, kc = start_new_kernel(kernel_name="sandfork", startup_timeout=120)
    finally:
        del os.environ["SANDFORK_SANDBOX_ID"]
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


def test_attached_kernel_leaves_the_sandbox_alone(engine: EngineProcess) -> None:
    with Sandbox.create(client=engine.client()) as sandbox:
        sandbox.create_code_context().run_code("shared = 'from the SDK'")
        with _attached_kernel(sandbox.id) as kc:
            messages = _execute(kc, "print(shared)")
            assert _stdout(messages) == "from the SDK\n"
        assert sandbox.refresh().status == "running"


def test_snapshot_restore_fork_and_sandbox_magics(engine: EngineProcess) -> None:
    km, kc = start_new_kernel(kernel_name="sandfork", startup_timeout=120)
    try:
        _execute(kc, "x = 1")
        # a magic on the first line runs first, then the rest of the cell
        snapshot_id, after = _stdout(_execute(kc, "%snapshot before\nx = 2\nprint(x)")).split()
        assert snapshot_id.startswith("snap_") and after == "2"
        info = _stdout(_execute(kc, "%sandbox"))
        first = info.split("id: ")[1].split()[0]
        assert "template: code-interpreter" in info and "memory: " in info
        restored = _execute(kc, f"%restore {snapshot_id}\nx")  # the rest runs in the new one
        assert _stdout(restored).startswith(f"restored {snapshot_id} into sbx_")
        result = next(m for m in restored if m["msg_type"] == "execute_result")
        assert result["content"]["data"]["text/plain"] == "1"
        assert first not in {s.id for s in Sandbox.list(engine.client())}  # the old one is gone
        _execute(kc, "x = 3")
        by_name = _execute(kc, "%restore before\nx")  # the newest snapshot of that name
        assert _stdout(by_name).startswith(f"restored {snapshot_id} into sbx_")
        result = next(m for m in by_name if m["msg_type"] == "execute_result")
        assert result["content"]["data"]["text/plain"] == "1"
        children = _stdout(_execute(kc, "%fork 2")).split()
        assert len(children) == 2
        for child_id in children:
            child = Sandbox.get(child_id, engine.client())
            assert child.create_code_context().run_code("x").text == "1"
            child.kill()
        failed = _execute(kc, "%restore nothing\nprint('not reached')")
        assert failed[-1]["content"]["status"] == "error"
        assert "no snapshot is named 'nothing'" in failed[-1]["content"]["evalue"]
        assert _stdout(failed) == ""
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


@pytest.mark.parametrize("end", ["killed", "crashed"])
def test_a_sandbox_that_ends_makes_the_kernel_say_so(engine: EngineProcess, end: str) -> None:
    """Killed through the API, or its VM dead: the kernel says so at once and goes dead."""
    sandbox = Sandbox.create(client=engine.client())
    with _attached_kernel(sandbox.id) as kc:
        if end == "killed":
            sandbox.kill()
        else:
            os.kill(engine.sandbox_pid(sandbox.id), signal.SIGKILL)
        said = ""
        while True:
            msg = kc.get_iopub_msg(timeout=300)  # unasked: no cell runs
            if msg["msg_type"] == "stream":
                said += msg["content"]["text"]
            if msg["msg_type"] == "status" and said:
                assert msg["content"]["execution_state"] == "dead"
                break
        assert f"sandbox {sandbox.id} is gone" in said
        reply = _execute(kc, "1")[-1]
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "SandboxUnavailable"
        assert sandbox.id in reply["content"]["evalue"]
    if end == "crashed":
        sandbox.kill()


def test_the_kernel_reconnects_after_an_engine_restart(
    own_engine: EngineProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDFORK_API", own_engine.url)
    monkeypatch.setenv("SANDFORK_API_KEY", own_engine.api_key)
    km, kc = start_new_kernel(kernel_name="sandfork", startup_timeout=120)
    try:
        _execute(kc, "kept = 'from before the restart'")
        own_engine.stop(signal.SIGKILL)
        deadline = time.monotonic() + 120
        while kc.hb_channel.is_beating() and time.monotonic() < deadline:
            time.sleep(0.5)
        down = _execute(kc, "kept")[-1]  # answered at once, not left waiting
        assert down["content"]["ename"] == "SandboxUnavailable"
        own_engine.args = ("--port", own_engine.url.rsplit(":", 1)[1])  # the URL the kernel has
        own_engine.start()
        deadline = time.monotonic() + 300  # a hang, not a speed
        while (reply := _execute(kc, "print(kept)"))[-1]["content"]["status"] != "ok":
            assert time.monotonic() < deadline, reply[-1]["content"]
            time.sleep(0.5)
        assert _stdout(reply) == "from before the restart\n"
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
