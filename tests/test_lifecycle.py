"""The whole life of a sandbox on a real VM: create, exec, code contexts, files, kill."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.sdk import (
    Client,
    CommandFailed,
    NotFoundError,
    Sandbox,
    SandboxTimeout,
)

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]


@pytest.fixture(scope="module")
def sandbox(engine: EngineProcess) -> Iterator[Sandbox]:
    sb = Sandbox.create("code-interpreter", client=engine.client())
    yield sb
    try:
        sb.kill()
    except NotFoundError:
        pass


def test_created_sandbox_is_running(sandbox: Sandbox, engine: EngineProcess) -> None:
    assert sandbox.id.startswith("sbx_")
    assert sandbox.status == "running"
    assert sandbox.accelerator in ("tcg", "kvm", "native")
    assert sandbox.memory_mb == 1024 and sandbox.cpu == 2
    assert len(engine.sandbox_pids()) >= 1
    assert any(s.id == sandbox.id for s in Sandbox.list(client=engine.client()))


def test_exec_python(sandbox: Sandbox) -> None:
    result = sandbox.exec(
        "python3 -c 'import sys, platform; print(6 * 7); print(platform.node(), file=sys.stderr)'"
    )
    assert result.exit_code == 0
    assert result.stdout == "42\n"
    assert result.stderr == "sandbox\n"
    failed = sandbox.exec("exit 3")
    assert failed.exit_code == 3
    with pytest.raises(CommandFailed) as info:
        sandbox.exec("echo oops >&2; exit 4", check=True)
    assert info.value.exit_code == 4 and info.value.stderr == "oops\n"


def test_exec_env_and_cwd(sandbox: Sandbox) -> None:
    result = sandbox.exec("echo $GREETING; pwd", env={"GREETING": "hi"}, cwd="/tmp")
    assert result.stdout == "hi\n/tmp\n"


def test_exec_streams_output(sandbox: Sandbox) -> None:
    chunks: list[str] = []

    def on_stdout(text: str) -> None:
        chunks.append(text)
        if "one" in text:  # only now may the command go on: its output must stream
            sandbox.exec("touch /tmp/stream-gate")

    code = sandbox.exec_stream(
        "echo one; until [ -e /tmp/stream-gate ]; do sleep 0.05; done; echo two; exit 5",
        on_stdout=on_stdout,
    )
    assert code == 5
    assert "".join(chunks) == "one\ntwo\n"


def test_exec_timeout_kills_the_command(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxTimeout):
        sandbox.exec("sleep 1000 & sleep 1000; echo never", timeout_seconds=2)
    assert "sleep 1000" not in sandbox.exec("ps -eo args").stdout  # the whole group was killed


def test_exec_output_is_capped(sandbox: Sandbox) -> None:
    result = sandbox.exec("head -c 5000000 /dev/zero | tr '\\0' x")
    assert result.truncated
    assert len(result.stdout) < 1_100_000
    assert "[sandfork: output truncated, 3951424 bytes omitted]" in result.stdout
    assert sandbox.exec("echo still-alive").stdout == "still-alive\n"


def test_code_context_keeps_a_big_dataframe(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context()
    first = ctx.run_code(
        "import numpy as np, pandas as pd\n"
        "df = pd.DataFrame(np.arange(10_000_000).reshape(2_000_000, 5), columns=list('abcde'))\n"
        "len(df)"
    )
    assert first.error is None, first.error
    assert first.text == "2000000"
    second = ctx.run_code("df['f'] = df.a * 2\nint(df.f.sum())")
    assert second.text == str(2 * sum(range(0, 10_000_000, 5)))
    again = sandbox.create_code_context()  # the default context: the same kernel
    assert again.id == ctx.id
    third = again.run_code("print(df.shape); df.shape[0] + 1")
    assert third.stdout == "(2000000, 6)\n"
    assert third.text == "2000001"


def test_rich_outputs(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context()
    fig = ctx.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()"
    )
    assert fig.error is None, fig.error
    assert fig.png is not None
    assert base64.b64decode(fig.png)[:8] == b"\x89PNG\r\n\x1a\n"
    table = ctx.run_code("import pandas as pd\npd.DataFrame({'x': [1, 2]})")
    assert table.html is not None and "<table" in table.html
    assert table.text is not None and "x" in table.text


def test_errors_come_back_structured(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context()
    result = ctx.run_code("1 / 0")
    assert result.error is not None
    assert result.error.name == "ZeroDivisionError"
    assert "division by zero" in result.error.value
    assert any("ZeroDivisionError" in line for line in result.error.traceback)
    assert "\x1b[" not in "".join(result.error.traceback)


def test_isolated_context_is_separate(sandbox: Sandbox) -> None:
    default = sandbox.create_code_context()
    default.run_code("shared = 1")
    isolated = sandbox.create_code_context(isolated=True)
    assert isolated.id != default.id
    result = isolated.run_code("shared")
    assert result.error is not None and result.error.name == "NameError"
    isolated.close()
    assert default.run_code("shared").text == "1"


def test_run_code_timeout_interrupts(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context()
    with pytest.raises(SandboxTimeout):
        ctx.run_code("import time\ntime.sleep(600)", timeout_seconds=2)
    assert ctx.run_code("'alive'").text == "'alive'"


def test_files(sandbox: Sandbox) -> None:
    fs = sandbox.filesystem
    payload = bytes(range(256)) * 100
    fs.write("/root/work/data.bin", payload)
    assert fs.read("/root/work/data.bin") == payload
    fs.write("/root/work/note.txt", "héllo")
    assert fs.read_text("/root/work/note.txt") == "héllo"
    names = {e["name"] for e in fs.listdir("/root/work")}
    assert names == {"data.bin", "note.txt"}
    assert fs.stat("/root/work/data.bin")["size"] == len(payload)
    # the kernel sees the same files
    ctx = sandbox.create_code_context()
    assert ctx.run_code("open('/root/work/note.txt').read()").text == "'héllo'"
    fs.delete("/root/work/note.txt")
    assert not fs.exists("/root/work/note.txt")
    with pytest.raises(NotFoundError):
        fs.read("/root/work/missing")


@pytest.mark.vm_only  # QEMU's QMP socket and disk
def test_kill_leaves_nothing_behind(engine: EngineProcess) -> None:
    client: Client = engine.client()
    sb = Sandbox.create(client=client)
    directory = Path(engine.home) / "sandboxes" / sb.id
    disk = Path(client.request("GET", f"/sandboxes/{sb.id}")["disk"])
    qmp = engine.ram_dir / f"{sb.id}.qmp"  # its sockets live in the RAM folder
    assert directory.is_dir() and disk.exists() and qmp.exists()
    pids_before = set(engine.sandbox_pids())
    sb.kill()  # returns once the VM is gone
    assert not directory.exists() and not disk.exists() and not qmp.exists()
    assert len(set(engine.sandbox_pids()) - pids_before) == 0
    assert len(engine.sandbox_pids()) == len(pids_before) - 1
    with pytest.raises(NotFoundError):
        Sandbox.get(sb.id, client=client)
    with pytest.raises(NotFoundError):
        sb.exec("true")
