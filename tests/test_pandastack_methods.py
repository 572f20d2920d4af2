"""Every method of the published ``pandastack`` SDK against the engine: one row per method.

A row either runs here (a function asserting what PandaStack does) or names the test of
test_pandastack_compat.py that asserts it; a method the engine does not serve asserts the
engine's 501 ("not served by Sandfork", listed in the README). The first test fails when
the SDK has a method no row names, so a new SDK version cannot slip past this table.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandastack
import pytest
from pandastack.sandbox import CodeContext, SandboxAPI, SandboxCommands, SandboxFilesystem

import test_pandastack_compat
from conftest import EngineProcess

pytestmark = pytest.mark.any_backend  # the rows boot a sandbox, the table none

CLASSES = {
    "Sandbox": pandastack.Sandbox,
    "SandboxCommands": SandboxCommands,
    "SandboxFilesystem": SandboxFilesystem,
    "CodeContext": CodeContext,
    "SandboxAPI": SandboxAPI,
    "SnapshotsAPI": pandastack.SnapshotsAPI,
    "TemplatesAPI": pandastack.TemplatesAPI,
}
# PandaStack's hosted services (the client's attribute of each): every method is a 501.
SERVICES = {
    "apps": pandastack.AppsAPI,
    "databases": pandastack.DatabasesAPI,
    "functions": pandastack.FunctionsAPI,
    "schedules": pandastack.SchedulesAPI,
    "volumes": pandastack.VolumesAPI,
    "tokens": pandastack.Client(api_url="http://127.0.0.1:9", api_key="k").tokens.__class__,
}


@dataclass
class Here:
    """What a row gets: the SDK's client, a running sandbox of its own, a scratch folder."""

    client: pandastack.Client
    sandbox: pandastack.Sandbox
    tmp: Path


def _create(h: Here) -> None:
    made = pandastack.Sandbox.create(template="code-interpreter", metadata={"row": "create"})
    try:
        assert made.status == "running" and made.metadata.get("row") == "create"
    finally:
        made.kill()


def _from_dict(h: Here) -> None:
    copy = pandastack.Sandbox.from_dict({"id": h.sandbox.id, "status": "running"}, h.client)
    assert copy.refresh().id == h.sandbox.id


def _exec_stream(h: Here) -> None:
    out: list[str] = []
    err: list[str] = []
    code = h.sandbox.exec_stream("echo one; echo two >&2; exit 3", out.append, err.append)
    assert code == 3 and "".join(out) == "one\n" and "".join(err) == "two\n"


def _run_code(h: Here) -> None:
    """PandaStack's one-off run: a python3 -c (or bash -c) command, not a kernel."""
    assert h.sandbox.run_code("print(6 * 7)").stdout == "42\n"
    assert h.sandbox.run_code("echo $((6 * 7))", language="bash").stdout == "42\n"


def _context(h: Here) -> None:
    context = h.sandbox.create_code_context()
    assert context.run_code("kept = 5").error is None
    assert context.run_code("kept + 1").text == "6"
    context.close()


def _get_list_refresh(h: Here) -> None:
    assert pandastack.Sandbox.get(h.sandbox.id).id == h.sandbox.id
    assert h.sandbox.id in [s.id for s in pandastack.Sandbox.list()]
    assert h.sandbox.refresh().status == "running"


def _preview_url(h: Here) -> None:
    """Computed by the SDK from its client's URL (the host form is not served: README)."""
    assert h.sandbox.preview_url(8000).startswith(f"https://8000-{h.sandbox.id}.")
    with pytest.raises(ValueError):
        h.sandbox.preview_url(0)


def _preview_urls(h: Here) -> None:
    h.sandbox.exec("nohup python3 -m http.server 8011 >/dev/null 2>&1 &", check=True)
    _until(lambda: 8011 in h.sandbox.preview_urls())
    assert h.sandbox.preview_urls()[8011] == h.sandbox.preview_url(8011)


def _commands_run(h: Here) -> None:
    result = h.sandbox.commands.run("echo ran")
    assert result.stdout == "ran\n" and result.exit_code == 0


def _files(h: Here) -> None:
    fs = h.sandbox.filesystem
    fs.write("/tmp/rows/a.txt", "alpha")
    assert fs.read("/tmp/rows/a.txt") == b"alpha"
    assert fs.exists("/tmp/rows/a.txt") and not fs.exists("/tmp/rows/none")
    assert fs.stat("/tmp/rows/a.txt").size == 5
    assert [e.name for e in fs.listdir("/tmp/rows")] == ["a.txt"]
    walked = [(top, [f.name for f in files]) for top, _, files in fs.walk("/tmp/rows")]
    assert walked == [("/tmp/rows", ["a.txt"])]
    local = h.tmp / "up.bin"
    local.write_bytes(b"\x00\x01up")
    fs.upload(local, "/tmp/rows/up.bin")
    fs.download("/tmp/rows/up.bin", h.tmp / "down.bin")
    assert (h.tmp / "down.bin").read_bytes() == b"\x00\x01up"


def _sandbox_api(h: Here) -> None:
    api = h.client.sandboxes
    made = api.create(template="code-interpreter")
    try:
        assert api.get(made.id).id == made.id and made.id in [s.id for s in api.list()]
        child = api.fork(made.id)
        children = api.fork_tree(made.id, 2)
        assert len(children) == 2
        promoted = api.promote(child.id, cleanup_siblings=False)
        assert promoted["sandbox"]["id"] == child.id
        for other in [child, *children]:
            api.delete(other.id)
    finally:
        api.delete(made.id)


def _snapshots_api(h: Here) -> None:
    api = h.client.snapshots
    snapshot = h.sandbox.snapshot()
    assert api.get(snapshot)["id"] == snapshot
    assert snapshot in [s["id"] for s in api.list(sandbox_id=h.sandbox.id)]
    api.delete(snapshot)
    assert snapshot not in [s["id"] for s in api.list()]


def _templates_read(h: Here) -> None:
    assert "code-interpreter" in [t.name for t in h.client.templates.list()]
    assert h.client.templates.get("code-interpreter").name == "code-interpreter"


def _not_served(call: Callable[[Here], object]) -> Callable[[Here], None]:
    def row(h: Here) -> None:
        with pytest.raises(pandastack.ServerError, match="not served by Sandfork"):
            result = call(h)
            if inspect.isgenerator(result):
                next(result)

    return row


def _service_call(service: str, method: str) -> Callable[[Here], None]:
    """A 501 row for a method of a hosted service: its required arguments made up (a file
    where one is read first)."""

    def call(h: Here) -> object:
        bound = getattr(getattr(h.client, service), method)
        args: list[object] = []
        for parameter in inspect.signature(bound).parameters.values():
            if parameter.default is inspect.Parameter.empty and parameter.kind in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                args.append(str(_tar(h)) if parameter.name.endswith("path") else "x1")
        return bound(*args)

    return _not_served(call)


def _until(probe: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 120  # a bound for a hang
    while not probe():
        assert time.monotonic() < deadline
        time.sleep(0.2)


COMPAT = test_pandastack_compat
# A row: a function run here; a test of test_pandastack_compat.py; or why it is not run.
ROWS: dict[str, Callable[[Here], None] | Callable[..., None] | str] = {
    "Sandbox.create": _create,
    "Sandbox.create_code_context": _context,
    "Sandbox.exec": COMPAT.test_pandastack_sdk_create_exec_run_code_kill,
    "Sandbox.exec_stream": _exec_stream,
    "Sandbox.explore": COMPAT.test_pandastack_explore_promotes_the_winner_and_keeps_the_parent,
    "Sandbox.fork": COMPAT.test_pandastack_sdk_snapshot_restore_fork,
    "Sandbox.fork_tree": COMPAT.test_pandastack_sdk_snapshot_restore_fork,
    "Sandbox.from_dict": _from_dict,
    "Sandbox.get": _get_list_refresh,
    "Sandbox.hibernate": COMPAT.test_pandastack_sdk_snapshot_restore_fork,
    "Sandbox.kill": COMPAT.test_pandastack_sdk_create_exec_run_code_kill,
    "Sandbox.lifecycle": COMPAT.test_pandastack_lifecycle_ttl_and_persistent,
    "Sandbox.list": _get_list_refresh,
    "Sandbox.logs": COMPAT.test_pandastack_logs_are_the_console_and_follow_it,
    "Sandbox.pause": COMPAT.test_pandastack_pause_keeps_the_memory_and_resume_goes_on,
    "Sandbox.preview_url": _preview_url,
    "Sandbox.preview_urls": _preview_urls,
    "Sandbox.promote": COMPAT.test_pandastack_explore_promotes_the_winner_and_keeps_the_parent,
    "Sandbox.refresh": _get_list_refresh,
    "Sandbox.resume": COMPAT.test_pandastack_pause_keeps_the_memory_and_resume_goes_on,
    "Sandbox.run_code": _run_code,
    "Sandbox.set_persistent": COMPAT.test_pandastack_lifecycle_ttl_and_persistent,
    "Sandbox.set_ttl": COMPAT.test_pandastack_lifecycle_ttl_and_persistent,
    "Sandbox.snapshot": COMPAT.test_pandastack_sdk_snapshot_restore_fork,
    "Sandbox.wake": COMPAT.test_pandastack_sdk_snapshot_restore_fork,
    "SandboxCommands.run": _commands_run,
    **{f"SandboxFilesystem.{name}": _files for name in ("download", "exists", "listdir")},
    **{f"SandboxFilesystem.{name}": _files for name in ("read", "stat", "upload", "walk")},
    "SandboxFilesystem.write": _files,
    "CodeContext.close": _context,
    "CodeContext.run_code": _context,
    **{f"SandboxAPI.{name}": _sandbox_api for name in ("create", "delete", "fork", "get")},
    **{f"SandboxAPI.{name}": _sandbox_api for name in ("fork_tree", "list", "promote")},
    **{f"SnapshotsAPI.{name}": _snapshots_api for name in ("delete", "get", "list")},
    "TemplatesAPI.list": _templates_read,
    "TemplatesAPI.get": _templates_read,
    "TemplatesAPI.builds": _not_served(lambda h: h.client.templates.builds()),
    "TemplatesAPI.get_build": _not_served(lambda h: h.client.templates.get_build("b1")),
    "TemplatesAPI.build_logs": _not_served(lambda h: h.client.templates.build_logs("b1")),
    "TemplatesAPI.wait_for_build": _not_served(lambda h: h.client.templates.wait_for_build("b")),
    "TemplatesAPI.delete": _not_served(lambda h: h.client.templates.delete("code-interpreter")),
    "TemplatesAPI.register": _not_served(lambda h: h.client.templates.register("t", "img:1")),
    "TemplatesAPI.build": _not_served(
        lambda h: h.client.templates.build("t", rootfs_tar=str(_tar(h)))
    ),
    "TemplatesAPI.build_from_dockerfile": _not_served(
        lambda h: h.client.templates.build_from_dockerfile("t", "FROM scratch\n")
    ),
    "TemplatesAPI.push": "runs docker build and docker push to PandaStack's registry on the "
    "client, then register (a 501 here, the row above): no Docker, and no traffic to a registry",
    "Client.me": _not_served(lambda h: h.client.me()),
    **{
        f"{service}.{method}": _service_call(service, method)
        for service, cls in SERVICES.items()
        for method, value in inspect.getmembers(cls)
        if not method.startswith("_") and callable(value)
    },
}


def _tar(h: Here) -> Path:
    path = h.tmp / "rootfs.tar"
    path.write_bytes(b"\0" * 1024)
    return path


def test_the_table_has_a_row_for_every_method_of_the_sdk() -> None:
    classes = {**CLASSES, "Client": pandastack.Client, **SERVICES}
    methods = {
        f"{name}.{method}"
        for name, cls in classes.items()
        for method, value in inspect.getmembers(cls)
        if not method.startswith("_") and callable(value)
    }
    assert set(ROWS) == methods, (sorted(methods - set(ROWS)), sorted(set(ROWS) - methods))
    client = pandastack.Client(api_url="http://127.0.0.1:9", api_key="k")  # never called
    assert all(isinstance(getattr(client, s), cls) for s, cls in SERVICES.items())
    for name, row in ROWS.items():
        assert isinstance(row, str) or callable(row), name
        if callable(row) and row.__module__ != __name__:
            assert row.__name__.startswith("test_"), f"{name} names {row} (not a test)"


@pytest.fixture(scope="module")
def here(engine: EngineProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Here]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PANDASTACK_API", engine.url)
        patch.setenv("PANDASTACK_API_KEY", engine.api_key)
        client = pandastack.Client(timeout=300)
        pandastack.set_default_client(client)
        sandbox = pandastack.Sandbox.create(template="code-interpreter")
        try:
            yield Here(client, sandbox, tmp_path_factory.mktemp("pandastack-rows"))
        finally:
            sandbox.kill()
            pandastack.set_default_client(None)


def _rows_run_here() -> dict[str, Callable[[Here], None]]:
    """Each function row of this module once, under the first method it covers."""
    found: dict[str, Callable[[Here], None]] = {}
    for name, row in ROWS.items():
        if callable(row) and row.__module__ == __name__ and row not in found.values():
            found[name] = row
    return found


@pytest.mark.vm
@pytest.mark.parametrize("method", list(_rows_run_here()))
def test_row(method: str, here: Here) -> None:
    _rows_run_here()[method](here)
