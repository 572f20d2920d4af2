"""The unmodified ``pandastack`` SDK from PyPI, pointed at the engine, drives a sandbox."""

from __future__ import annotations

import asyncio
import glob
import threading
from collections.abc import Iterator
from pathlib import Path

import pandastack
import pytest
from qemu.qmp import QMPClient

from conftest import EngineProcess

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]


@pytest.fixture
def ps_client(
    engine: EngineProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[pandastack.Client]:
    """The published SDK's client, configured only through its documented variables."""
    monkeypatch.setenv("PANDASTACK_API", engine.url)
    monkeypatch.setenv("PANDASTACK_API_KEY", engine.api_key)
    client = pandastack.Client(timeout=300)
    pandastack.set_default_client(client)
    yield client
    pandastack.set_default_client(None)


def test_pandastack_sdk_create_exec_run_code_kill(ps_client: pandastack.Client) -> None:
    client = ps_client
    sandbox = pandastack.Sandbox.create(template="code-interpreter")
    assert sandbox.status == "running"
    result = sandbox.exec("python3 -c 'print(sum(range(10)))'", check=True)
    assert result.stdout == "45\n" and result.exit_code == 0

    ctx = sandbox.create_code_context()
    ctx.run_code("import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})")
    ex = ctx.run_code("print('rows'); int(df.shape[0])")
    assert ex.text == "1000"
    assert ex.stdout == "rows\n"
    png = ctx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()").png
    assert png is not None and png.startswith("iVBORw0KGgo")

    with pytest.raises(pandastack.SandboxTimeout):
        sandbox.exec("sleep 60", timeout_seconds=1)

    sandbox.filesystem.write("/tmp/hello.txt", "hi")
    assert sandbox.filesystem.read("/tmp/hello.txt") == b"hi"
    assert any(e.name == "hello.txt" for e in sandbox.filesystem.listdir("/tmp"))

    listed = [s.id for s in client.sandboxes.list()]
    assert sandbox.id in listed
    sandbox.kill()
    assert sandbox.id not in [s.id for s in client.sandboxes.list()]


def test_pandastack_sdk_snapshot_restore_fork(ps_client: pandastack.Client) -> None:
    client = ps_client
    made = []
    try:
        sandbox = pandastack.Sandbox.create(template="code-interpreter")
        made.append(sandbox)
        sandbox.create_code_context().run_code("state = 'turn1'")
        snapshot_id = sandbox.snapshot()
        assert isinstance(snapshot_id, str) and snapshot_id.startswith("snap_")
        assert snapshot_id in [s["id"] for s in client.snapshots.list()]

        restored = pandastack.Sandbox.create(template="code-interpreter", from_snapshot=snapshot_id)
        made.append(restored)
        assert restored.create_code_context().run_code("state").text == "'turn1'"

        branch = sandbox.fork()
        made.append(branch)
        assert branch.id != sandbox.id
        assert branch.create_code_context().run_code("state").text == "'turn1'"

        children = sandbox.fork_tree(count=3)
        made.extend(children)
        assert len(children) == 3
        for child in children:
            assert child.create_code_context().run_code("state").text == "'turn1'"
        client.snapshots.delete(snapshot_id)
    finally:
        for sb in made:
            sb.kill()


def test_pandastack_explore_promotes_the_winner_and_keeps_the_parent(
    ps_client: pandastack.Client,
) -> None:
    """``explore`` ends with ``promote(cleanup_siblings=True, tree_id=…)``: in PandaStack the
    winner becomes independent and the losers go; the explored sandbox lives on."""
    sandbox = pandastack.Sandbox.create(template="code-interpreter")
    winner = None
    try:
        sandbox.create_code_context().run_code("kept = sum(range(10))")
        result = sandbox.explore(
            ["echo 1", "echo 3", "echo 2"],
            score_fn=lambda _sb, outcome: float(outcome.stdout_tail.strip() or 0),
        )
        winner = result.winner
        assert winner is not None and result.winner_outcome.label is not None
        assert winner.exec("echo 3").stdout.strip() == "3"
        assert len(result.reaped) == 2 and winner.id not in result.reaped
        live = {s.id for s in ps_client.sandboxes.list()}
        assert not live & set(result.reaped)
        assert sandbox.create_code_context().run_code("kept").text == "45"
        info = ps_client.sandboxes.get(winner.id)
        assert info.metadata["promoted_from"] == sandbox.id
        assert "fork_parent_id" not in info.metadata
    finally:
        for box in (winner, sandbox):
            if box is not None:
                box.kill()


def test_pandastack_lifecycle_ttl_and_persistent(ps_client: pandastack.Client) -> None:
    """``set_ttl``, ``set_persistent`` and ``lifecycle``: a TTL is the sandbox's lease
    (killed when it runs out unless renewed); a persistent sandbox has none."""
    sandbox = pandastack.Sandbox.create(template="code-interpreter")
    try:
        assert sandbox.lifecycle() | {"id": None} == {
            "id": None,
            "persistent": False,
            "ttl_seconds": None,
            "on_expiry": "kill",  # ours: or "hibernate" (test_leases.py)
            "expires_in": None,
            "expires_at": None,
        }
        ttl = sandbox.set_ttl(600)
        assert ttl["ttl_seconds"] == 600 and 0 < ttl["expires_in"] <= 600
        assert ttl["expires_at"].endswith("Z")
        with pytest.raises(pandastack.BadRequestError, match="between 5 and"):
            sandbox.set_ttl(0)
        made = sandbox.set_persistent(True)
        assert made["persistent"] and made["ttl_seconds"] is None and made["expires_in"] is None
        with pytest.raises(pandastack.BadRequestError, match="persistent"):
            sandbox.set_ttl(600)
        assert ps_client.sandboxes.get(sandbox.id).persistent
        assert not sandbox.set_persistent(False)["persistent"]
        assert sandbox.exec("echo alive", check=True).stdout == "alive\n"
    finally:
        sandbox.kill()


def _frozen(engine: EngineProcess, sandbox_id: str) -> bool:
    """Whether the sandbox's processes are stopped, as the host's kernel or QEMU says."""
    info = engine.client().request("GET", f"/sandboxes/{sandbox_id}")
    if info["isolation"] == "container":
        v1 = glob.glob(f"/sys/fs/cgroup/freezer/sandfork/*/{sandbox_id}/freezer.state")
        if v1:
            return Path(v1[0]).read_text().strip() == "FROZEN"
        (events,) = glob.glob(f"/sys/fs/cgroup/sandfork/*/{sandbox_id}/cgroup.events")
        return "frozen 1" in Path(events).read_text().splitlines()

    async def query() -> bool:
        qmp = QMPClient("test")
        await qmp.connect(str(engine.ram_dir / f"{sandbox_id}.qmp"))
        try:
            return not (await qmp.execute("query-status"))["running"]  # type: ignore[index]
        finally:
            await qmp.disconnect()

    return asyncio.run(query())


def test_pandastack_pause_keeps_the_memory_and_resume_goes_on(
    ps_client: pandastack.Client, engine: EngineProcess
) -> None:
    sandbox = pandastack.Sandbox.create(template="code-interpreter")
    try:
        ctx = sandbox.create_code_context()
        ctx.run_code("counter = 41")
        sandbox.pause()
        assert ps_client.sandboxes.get(sandbox.id).status == "paused"
        assert _frozen(engine, sandbox.id)
        with pytest.raises(pandastack.BadRequestError, match="is paused: resume it first"):
            sandbox.exec("true")
        sandbox.pause()  # again: nothing changes
        sandbox.resume()
        assert ps_client.sandboxes.get(sandbox.id).status == "running"
        assert not _frozen(engine, sandbox.id)
        assert ctx.run_code("counter + 1").text == "42"
        sandbox.pause()
    finally:
        sandbox.kill()  # paused: a kill still ends it
    assert sandbox.id not in [s.id for s in ps_client.sandboxes.list()]


def test_pandastack_logs_are_the_console_and_follow_it(
    ps_client: pandastack.Client, engine: EngineProcess
) -> None:
    """``logs()``: the agent's lines on the sandbox's console; ``follow`` streams new ones (a
    kernel started meanwhile says so)."""
    sandbox = pandastack.Sandbox.create(template="code-interpreter")
    try:
        assert any("egress session" in line for line in sandbox.logs())
        seen: list[str] = []
        opened = threading.Event()

        def watch() -> None:
            lines = sandbox.logs(follow=True)
            for line in lines:
                seen.append(line)
                opened.set()  # the stream is open: its first lines came
                if "started (pid" in line and "kernel default" not in line:
                    break
            lines.close()  # type: ignore[attr-defined]

        watcher = threading.Thread(target=watch)
        watcher.start()
        assert opened.wait(120)
        context = engine.client().request(
            "POST", f"/sandboxes/{sandbox.id}/repl/sessions", json={"isolated": True}
        )  # a kernel of its own: the agent says it started
        watcher.join(120)
        assert not watcher.is_alive(), seen[-5:]
        assert f"kernel {context['id']}" in seen[-1], seen[-5:]
        with pytest.raises(pandastack.BadRequestError, match="stream must be one of"):
            list(sandbox.logs(stream="nope"))
    finally:
        sandbox.kill()
