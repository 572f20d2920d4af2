"""The guest agent, run on the host over a Unix socket, with real ipykernel processes."""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import os
import select
import signal
import subprocess
import sys
import time
import tty
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from agent_client import (
    AGENT_SRC,
    AgentClient,
    AgentProcess,
    jupyter_msg,
    pid_alive,
    wait_dead,
)

DEFAULT = "default"
MARKER = "\n[sandfork: output truncated, {} bytes omitted]\n"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """One agent for the module; its default kernel is shared by the context tests."""
    proc = AgentProcess(tmp_path_factory.mktemp("agent"))
    proc.start()
    try:
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, proc.log()
        # The agent kills its kernels when it stops.
        assert proc.leaked_kernels == []


@pytest_asyncio.fixture
async def client(agent: AgentProcess) -> AsyncIterator[AgentClient]:
    """A fresh host connection per test."""
    conn = await AgentClient.connect(agent.socket_path)
    try:
        yield conn
    finally:
        await conn.close()


async def kernel_pid(client: AgentClient, agent: AgentProcess, context: str) -> int:
    """The pid of a context's kernel (remembered so the fixture can check cleanup)."""
    run = await client.execute(context, "import os; os.getpid()")
    assert run.text is not None, run.iopub
    pid = int(run.text)
    agent.kernel_pids.add(pid)
    return pid


# --- package layout -------------------------------------------------------------------------


def test_imports_are_relative_or_stdlib() -> None:
    """The package is copied into the guest under another name, with only stdlib + jupyter."""
    for path in AGENT_SRC.glob("*.py"):
        tree = ast.parse(path.read_text())
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only or (isinstance(node, ast.ImportFrom) and node.level):
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                allowed = top in sys.stdlib_module_names or (
                    path.name == "kernel.py" and top in ("zmq", "jupyter_client")
                )
                assert allowed, f"{path.name} imports {name}"


def test_jupyter_is_imported_lazily(agent: AgentProcess) -> None:
    code = (
        "import sys, sandfork_agent.__main__, sandfork_agent.server\n"
        "assert 'jupyter_client' not in sys.modules and 'zmq' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(agent.workdir / "pkg")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)


def test_imports_as_sandfork_agent() -> None:
    import sandfork.agent.server

    assert sandfork.agent.server.Agent.__doc__


# --- framing and basics -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_ping(client: AgentClient, agent: AgentProcess) -> None:
    result = await asyncio.wait_for(client.request("ping"), 30)
    assert result["pid"] == agent.pid
    assert result["version"]
    assert isinstance(result["uptime_s"], float)
    assert isinstance(result["boot_id"], str)


HELD_KERNEL = """\
import os, sys, time
if "ipykernel_launcher" in sys.orig_argv:  # a kernel of the agent's: wait at the gate
    gate = {gate!r}
    open(gate + ".held", "w").close()
    while os.path.exists(gate):
        time.sleep(0.01)
"""


@pytest.mark.asyncio
async def test_ping_is_answered_while_the_default_kernel_starts(tmp_path: Path) -> None:
    # The agent's kernels start with its PYTHONPATH: a sitecustomize there holds each one
    # before it imports anything, until the gate goes, so the kernel is surely starting.
    gate = tmp_path / "gate"
    gate.touch()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(HELD_KERNEL.format(gate=str(gate)))
    proc = AgentProcess(tmp_path, extra_path=(str(tmp_path / "site"),))
    proc.start()
    try:
        conn = await AgentClient.connect(proc.socket_path)
        await asyncio.wait_for(conn.request("ping"), 30)
        while not gate.with_name("gate.held").exists():  # the default kernel is held
            await asyncio.sleep(0.01)
        assert (await conn.request("ping"))["pid"] == proc.pid  # the ping did not wait for it
        listed = await conn.request("ctx.list")
        assert listed["contexts"][0]["status"] == "starting"
        # A send waits for the kernel that is still starting.
        sent = asyncio.ensure_future(conn.execute(DEFAULT, "6 * 7"))
        gate.unlink()
        assert (await sent).text == "42"
        await conn.close()
    finally:
        gate.unlink(missing_ok=True)
        assert proc.stop() == 0, proc.log()


@pytest.mark.asyncio
async def test_malformed_lines_are_ignored(client: AgentClient) -> None:
    await client.write_raw(b'this is not json\n[1, 2]\n{"op": "ping"}\n{"id": "x"}\n\n')
    await client.write_raw(b'{"id": 99, "op": ')  # a frame cut off mid-way...
    await client.write_raw(b"\n")  # ...and terminated
    assert (await client.request("ping"))["pid"]


def test_frames_are_valid_utf8_json_lines() -> None:
    from sandfork.agent.protocol import decode, encode

    for frame in ({"id": 1, "text": "héllo\n✓"}, {"id": None, "text": "\ud800"}):
        line = encode(frame)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        line.decode("utf-8")
        assert decode(line) == frame


def test_virtio_port_mode(tmp_path: Path) -> None:
    """The guest transport, on a pty: EIO on read means the host went away."""
    master, slave = os.openpty()
    tty.setraw(slave)
    proc = AgentProcess(tmp_path, port=os.ttyname(slave))
    proc.start()
    try:
        buf = b""

        def request(frame: bytes) -> dict[str, object]:
            nonlocal buf
            os.write(master, frame + b"\n")
            deadline = time.monotonic() + 60  # a hang, not a speed
            while True:
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    reply = json.loads(line)
                    if reply.get("id") == json.loads(frame)["id"] and "event" not in reply:
                        return dict(reply)
                assert time.monotonic() < deadline, proc.log()
                if select.select([master], [], [], 0.1)[0]:
                    buf += os.read(master, 65536)

        os.write(master, b"garbage\n")
        assert request(b'{"id": 1, "op": "ping"}')["ok"]
        reply = request(b'{"id": 2, "op": "exec", "cmd": "echo hi", "stream": true}')
        assert reply["result"]["stdout"] == "hi\n"  # type: ignore[index]
        os.close(master)
        deadline = time.monotonic() + 30
        while "host disconnected" not in proc.log():  # the agent saw EIO
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.01)
        assert proc.process is not None and proc.process.poll() is None  # and waits for the host
    finally:
        os.close(slave)
        assert proc.stop() == 0, proc.log()
    assert "host disconnected" in proc.log()
    assert "Traceback" not in proc.log()


@pytest.mark.asyncio
async def test_bad_requests(client: AgentClient) -> None:
    assert (await client.call("no.such.op")).error_type == "BadRequest"
    assert (await client.call("exec")).error_type == "BadRequest"
    assert (await client.call("exec", cmd=1)).error_type == "BadRequest"
    assert (await client.call("exec", cmd="true", env={"A": 1})).error_type == "BadRequest"
    assert (await client.call("fs.read")).error_type == "BadRequest"
    bad_b64 = await client.call("fs.write", path="/tmp/x", data="***")
    assert bad_b64.error_type == "BadRequest"


# --- exec -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_exec_exit_code_and_output(client: AgentClient) -> None:
    result = await client.request("exec", cmd="echo out; echo err >&2; exit 3")
    assert result["exit_code"] == 3
    assert result["stdout"] == "out\n"
    assert result["stderr"] == "err\n"
    assert result["timed_out"] is False
    assert result["truncated"] is False
    assert result["duration_ms"] >= 0


@pytest.mark.asyncio
async def test_exec_signal_exit_and_invalid_utf8(client: AgentClient) -> None:
    assert (await client.request("exec", cmd="kill -9 $$"))["exit_code"] == 137
    result = await client.request("exec", cmd="printf 'a\\377b'")
    assert result["stdout"] == "a\ufffdb"


@pytest.mark.asyncio
async def test_exec_env_and_cwd(client: AgentClient, tmp_path: Path) -> None:
    result = await client.request(
        "exec", cmd='echo "$GREETING"; pwd; echo "$PATH"', env={"GREETING": "hi"}, cwd=str(tmp_path)
    )
    greeting, cwd, path = result["stdout"].splitlines()
    assert greeting == "hi"
    assert cwd == str(tmp_path)
    assert path.endswith("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    missing = await client.call("exec", cmd="true", cwd=str(tmp_path / "missing"))
    assert missing.error_type == "NotFound"


@pytest.mark.asyncio
async def test_exec_streams_before_the_reply(client: AgentClient, tmp_path: Path) -> None:
    gate = tmp_path / "stream-gate"  # the command ends only once its first line reached us
    cmd = f"echo one; echo warn >&2; until [ -e {gate} ]; do sleep 0.01; done; echo two"
    call = asyncio.ensure_future(client.call("exec", cmd=cmd, stream=True))
    while {"one\n", "warn\n"} - {f.get("data") for f in client.streamed_so_far()}:
        assert not call.done(), call.result()
        await asyncio.sleep(0.01)
    gate.touch()
    reply = await call
    assert reply.result["stdout"] == "one\ntwo\n"
    assert reply.streamed("stdout") == "one\ntwo\n"
    assert reply.streamed("stderr") == "warn\n"
    first = reply.events[0][1]
    assert first == {"id": first["id"], "event": "stdout", "data": "one\n"}


@pytest.mark.asyncio
async def test_exec_timeout_kills_the_process_group(client: AgentClient) -> None:
    # Sleeps far longer than any test: only the kill at the timeout lets the reply come.
    result = await client.request(
        "exec", cmd="sleep 3000 & echo $!; sleep 3000", timeout=3, stream=True
    )
    assert result["timed_out"] is True
    assert result["exit_code"] == 124
    background = int(result["stdout"])
    assert wait_dead(background, 30.0)


@pytest.mark.asyncio
async def test_exec_does_not_wait_for_background_processes(client: AgentClient) -> None:
    result = await client.request("exec", cmd="sleep 60 & echo $!")
    background = int(result["stdout"])
    assert pid_alive(background)  # the answer came while it still ran
    os.kill(background, signal.SIGKILL)


@pytest.mark.asyncio
async def test_exec_output_cap(client: AgentClient) -> None:
    big = 3_000_000
    result = await client.request(
        "exec", cmd=f"head -c {big} /dev/zero | tr '\\0' x; echo done >&2", max_output=1000
    )
    assert result["truncated"] is True
    assert result["stdout"] == "x" * 1000 + MARKER.format(big - 1000)
    assert result["stderr"] == "done\n"
    streamed = await client.call(
        "exec", cmd=f"head -c {big} /dev/zero | tr '\\0' y", max_output=10, stream=True
    )
    assert streamed.streamed("stdout") == streamed.result["stdout"]
    assert streamed.result["stdout"] == "y" * 10 + MARKER.format(big - 10)
    # The default cap keeps a MiB and the agent keeps answering.
    result = await client.request("exec", cmd="head -c 5000000 /dev/zero")
    assert len(result["stdout"]) == (1 << 20) + len(MARKER.format(5_000_000 - (1 << 20)))
    assert (await client.request("ping"))["pid"]


@pytest.mark.asyncio
async def test_requests_run_concurrently(client: AgentClient, tmp_path: Path) -> None:
    release = tmp_path / "release"
    slow = await client.start("exec", cmd=f"while [ ! -e {release} ]; do sleep 0.01; done")
    await asyncio.wait_for(client.request("ping"), 30)
    await asyncio.wait_for(client.request("fs.stat", path="/"), 30)
    assert not slow.done()  # answered while the exec waits for the file
    release.touch()
    assert (await asyncio.wait_for(slow, 30)).result["exit_code"] == 0


# --- files ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_files_roundtrip(client: AgentClient, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 100
    target = tmp_path / "a" / "b" / "data.bin"
    written = await client.request(
        "fs.write", path=str(target), data=base64.b64encode(payload).decode(), mode=0o600
    )
    assert written == {"path": str(target), "size": len(payload)}
    read = await client.request("fs.read", path=str(target))
    assert base64.b64decode(read["data"]) == payload
    assert read["size"] == len(payload)

    stat = await client.request("fs.stat", path=str(target))
    assert stat["name"] == "data.bin"
    assert stat["path"] == str(target)
    assert stat["is_dir"] is False
    assert stat["size"] == len(payload)
    assert stat["mode"] == "0600"
    assert abs(stat["mtime"] - time.time()) < 60

    (tmp_path / "a" / "b" / "other.txt").write_text("hi")
    listing = await client.request("fs.list", path=str(tmp_path / "a" / "b"))
    assert [e["name"] for e in listing["entries"]] == ["data.bin", "other.txt"]
    assert (await client.request("fs.stat", path=str(tmp_path / "a")))["is_dir"] is True


@pytest.mark.asyncio
async def test_files_delete(client: AgentClient, tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    file = tmp_path / "d" / "e" / "f.txt"
    assert await client.request("fs.delete", path=str(file)) == {}
    assert (await client.call("fs.read", path=str(file))).error_type == "NotFound"
    (tmp_path / "d" / "g.txt").write_text("x")
    not_empty = await client.call("fs.delete", path=str(tmp_path / "d"))
    assert not_empty.error_type == "IsADirectory"
    await client.request("fs.delete", path=str(tmp_path / "empty"))
    await client.request("fs.delete", path=str(tmp_path / "d"), recursive=True)
    assert not (tmp_path / "d").exists() and not (tmp_path / "empty").exists()


@pytest.mark.asyncio
async def test_file_errors(client: AgentClient, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    for op in ("fs.read", "fs.stat", "fs.list", "fs.delete"):
        assert (await client.call(op, path=missing)).error_type == "NotFound", op
    assert (await client.call("fs.list", path=str(tmp_path / "file"))).error_type == (
        "NotADirectory"
    )
    assert (await client.call("fs.read", path=str(tmp_path))).error_type == "IsADirectory"


# --- system ---------------------------------------------------------------------------------


def _has_cap_sys_time() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 25))
    return False


@pytest.mark.asyncio
async def test_sys_reseed(client: AgentClient) -> None:
    entropy = base64.b64encode(os.urandom(64)).decode()
    assert await client.request("sys.reseed", entropy=entropy) == {}
    assert (await client.call("sys.reseed", entropy="!")).error_type == "BadRequest"


@pytest.mark.asyncio
async def test_sys_set_time_needs_privilege(client: AgentClient, agent: AgentProcess) -> None:
    assert (await client.call("sys.set_time", epoch_ns=-1)).error_type == "BadRequest"
    if not _has_cap_sys_time():
        denied = await client.call("sys.set_time", epoch_ns=time.time_ns())
        assert denied.error_type == "PermissionDenied"
        return
    if os.getuid() != 0:
        pytest.skip("allowed to set the clock but cannot drop the privilege to test the error")
    # Going through the agent would change this host's clock: drop root in a child instead.
    code = (
        "import os, time\n"
        "from sandfork_agent.protocol import AgentError\n"
        "from sandfork_agent.system import set_time\n"
        "os.setuid(65534)\n"
        "try:\n"
        "    set_time(time.time_ns())\n"
        "except AgentError as e:\n"
        "    print(e.kind)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(agent.workdir / "pkg")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.stdout.strip() == "PermissionDenied", out.stderr


# --- code contexts --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_default_context_keeps_state(client: AgentClient, agent: AgentProcess) -> None:
    assert (await client.request("ctx.create"))["id"] == DEFAULT
    await kernel_pid(client, agent, DEFAULT)
    first = await client.execute(DEFAULT, "kept_value = 21\nprint('set')")
    assert first.reply["content"]["status"] == "ok"
    assert first.stdout == "set\n"
    second = await client.execute(DEFAULT, "kept_value * 2")
    assert second.text == "42"
    assert second.reply["header"]["msg_type"] == "execute_reply"
    listed = await client.request("ctx.list")
    assert {"id": DEFAULT, "language": "python", "status": "running"} in listed["contexts"]


@pytest.mark.asyncio
async def test_errors_are_forwarded(client: AgentClient) -> None:
    run = await client.execute(DEFAULT, "1 / 0")
    assert run.error_name == "ZeroDivisionError"
    assert run.reply["content"]["status"] == "error"


@pytest.mark.asyncio
async def test_input_via_stdin_channel(client: AgentClient) -> None:
    run = await client.execute(
        DEFAULT, "answer = input('who? ')\nprint('hello', answer)", stdin_answer="sandfork"
    )
    assert run.stdout.endswith("hello sandfork\n")


@pytest.mark.asyncio
async def test_ctx_send_errors(client: AgentClient) -> None:
    msg = {"header": {"msg_id": "x", "msg_type": "kernel_info_request"}, "content": {}}
    unknown = await client.call("ctx.send", context="nope", channel="shell", msg=msg)
    assert unknown.error_type == "NotFound"
    bad_channel = await client.call("ctx.send", context=DEFAULT, channel="iopub", msg=msg)
    assert bad_channel.error_type == "BadRequest"
    no_header = await client.call("ctx.send", context=DEFAULT, channel="shell", msg={})
    assert no_header.error_type == "BadRequest"


@pytest.mark.asyncio
async def test_isolated_context(client: AgentClient, agent: AgentProcess) -> None:
    await client.execute(DEFAULT, "only_in_default = 1")
    created = await client.request("ctx.create", isolated=True)
    ctx = created["id"]
    assert ctx != DEFAULT and created["status"] == "running"
    await kernel_pid(client, agent, ctx)
    run = await client.execute(ctx, "only_in_default")
    assert run.error_name == "NameError"
    ids = [c["id"] for c in (await client.request("ctx.list"))["contexts"]]
    assert DEFAULT in ids and ctx in ids

    await client.request("ctx.shutdown", context=ctx)
    ids = [c["id"] for c in (await client.request("ctx.list"))["contexts"]]
    assert ctx not in ids
    msg = {"header": {"msg_id": "y", "msg_type": "kernel_info_request"}, "content": {}}
    gone = await client.call("ctx.send", context=ctx, channel="shell", msg=msg)
    assert gone.error_type == "NotFound"


@pytest.mark.asyncio
async def test_interrupt(client: AgentClient) -> None:
    msg_id = await client.send_execute(
        DEFAULT, "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"
    )
    await client.wait_event(
        lambda f: (
            f.get("event") == "kernel"
            and f["msg"]["parent_header"].get("msg_id") == msg_id
            and f["msg"]["header"]["msg_type"] == "stream"
        )
    )
    await client.request("ctx.interrupt", context=DEFAULT)
    # Unless interrupted, the cell ends after its minute without an error.
    run = await client.collect(DEFAULT, msg_id, timeout=120)
    assert run.error_name == "KeyboardInterrupt"


@pytest.mark.asyncio
async def test_restart_clears_state(client: AgentClient, agent: AgentProcess) -> None:
    before = await kernel_pid(client, agent, DEFAULT)
    await client.execute(DEFAULT, "before_restart = 1")
    assert await client.request("ctx.restart", context=DEFAULT) == {}
    event = await client.wait_event(lambda f: f.get("event") == "context_status")
    assert event["context"] == DEFAULT and event["status"] == "restarted"
    assert wait_dead(before, 5)
    after = await kernel_pid(client, agent, DEFAULT)
    assert after != before
    assert (await client.execute(DEFAULT, "before_restart")).error_name == "NameError"
    listed = await client.request("ctx.list")
    assert [c["id"] for c in listed["contexts"]] == [DEFAULT]


@pytest.mark.asyncio
async def test_kernel_death_is_reported_and_next_send_restarts(
    client: AgentClient, agent: AgentProcess
) -> None:
    await client.execute(DEFAULT, "survives_death = 1")
    pid = await kernel_pid(client, agent, DEFAULT)
    os.kill(pid, signal.SIGKILL)
    dead = await client.wait_event(lambda f: f.get("event") == "context_status", timeout=10)
    assert dead["context"] == DEFAULT and dead["status"] == "dead"
    assert "signal 9" in dead["reason"]
    listed = await client.request("ctx.list")
    assert {"id": DEFAULT, "language": "python", "status": "dead"} in listed["contexts"]

    run = await client.execute(DEFAULT, "survives_death")
    assert run.error_name == "NameError"
    restarted = await client.wait_event(lambda f: f.get("event") == "context_status")
    assert restarted["status"] == "restarted"
    assert await kernel_pid(client, agent, DEFAULT) != pid


@pytest.mark.asyncio
async def test_kernel_that_cannot_start(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "ipykernel_launcher.py").write_text("raise SystemExit(3)\n")
    proc = AgentProcess(tmp_path, extra_path=(str(fake),))
    proc.start()
    try:
        conn = await AgentClient.connect(proc.socket_path)
        failed = await conn.call("ctx.create", isolated=True)
        assert failed.error_type == "KernelDied"
        assert "exited with code 3" in failed.frame["error"]["message"]
        assert [c["id"] for c in (await conn.request("ctx.list"))["contexts"]] == [DEFAULT]
        send = await conn.call(
            "ctx.send",
            context=DEFAULT,
            channel="shell",
            msg=jupyter_msg("kernel_info_request", {}, conn.session),
        )
        assert send.error_type == "KernelDied"
        dead = await conn.wait_event(lambda f: f.get("event") == "context_status")
        assert dead["status"] == "dead" and dead["reason"] == "exited with code 3"
        assert (await conn.request("ping"))["pid"] == proc.pid
        await conn.close()
    finally:
        assert proc.stop() == 0, proc.log()


@pytest.mark.asyncio
async def test_reconnect_keeps_agent_and_kernels(agent: AgentProcess, tmp_path: Path) -> None:
    first = await AgentClient.connect(agent.socket_path)
    await first.execute(DEFAULT, "across_reconnect = 'still here'")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(8 << 20))
    # Leave while the agent is busy writing a large frame and running a command.
    await first.start("fs.read", path=str(big))
    await first.start("exec", cmd="sleep 0.3; echo late", stream=True)
    await first.close()

    second = await AgentClient.connect(agent.socket_path)
    try:
        assert (await second.request("ping"))["pid"] == agent.pid
        assert (await second.execute(DEFAULT, "across_reconnect")).text == "'still here'"
        read = await second.request("fs.read", path=str(big))
        assert read["size"] == 8 << 20
    finally:
        await second.close()


@pytest.mark.asyncio
async def test_stop_kills_kernels(tmp_path: Path) -> None:
    proc = AgentProcess(tmp_path)
    proc.start()
    try:
        conn = await AgentClient.connect(proc.socket_path)
        pid = await kernel_pid(conn, proc, DEFAULT)
        await conn.close()
        assert pid_alive(pid)
    finally:
        returncode = proc.stop()
    assert returncode == 0, proc.log()
    assert proc.leaked_kernels == []


@pytest.mark.asyncio
async def test_many_events_in_flight(client: AgentClient) -> None:
    run = await client.execute(DEFAULT, "for i in range(2000): print(i)")
    assert run.stdout.splitlines()[-1] == "1999"


def test_agent_log_is_clean(agent: AgentProcess) -> None:
    log = agent.log()
    assert "Traceback" not in log, log


@pytest.mark.asyncio
async def test_ports_lists_servers_but_not_the_kernels_own_listeners(
    client: AgentClient, agent: AgentProcess
) -> None:
    """The agent runs on the host here: its listing is the host's listeners, less its own and
    its kernels'. A server started in a cell is listed; the kernel's IOPub pipe is not."""
    pid = await kernel_pid(client, agent, DEFAULT)
    from sandfork.agent.ports import listened_by

    own = listened_by(pid)
    assert own, "ipykernel's IOPub pipe listens on a loopback port"
    served = await client.execute(
        DEFAULT,
        "import socket\n_server = socket.socket()\n_server.bind(('127.0.0.1', 0))\n"
        "_server.listen()\n_server.getsockname()[1]",
    )
    assert served.text is not None, served.iopub
    listed = (await client.request("ports"))["ports"]
    assert int(served.text) in listed
    assert not own & set(listed), (own, listed)
    assert listed == sorted(listed)
    await client.execute(DEFAULT, "_server.close()")
