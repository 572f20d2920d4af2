"""The Jupyter server extension's REST handlers (docs/jupyter-api.md) in a real Jupyter Server
(pytest-jupyter), with real Sandfork kernels, a real engine and real VMs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_server.base.handlers import APIHandler
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

from conftest import EngineProcess
from jupyter_server_fixtures import (  # noqa: F401 (fixtures, found by name)
    Fetch,
    attached,
    call,
    jp_server_config,
    kernels_shut_down_after_the_test,
    notebook,
    run,
    start_session,
    wait_step,
)
from sandfork.jupyter.handlers import HANDLERS
from sandfork.sdk import Sandbox

pytestmark = pytest.mark.portable  # runs on every backend (the suite's container pass too)

SNAP = "snap_0123456789abcdef"
# Every endpoint: method, path, body, and the rights on the server's other resources it needs
# beyond its own on `sandfork` (GET: read, others: write).
ENDPOINTS: list[tuple[str, str, Any, tuple[str, ...]]] = [
    ("GET", "sandfork/api/kernels/k1", None, ("kernels",)),
    ("GET", "sandfork/api/kernels/k1/ports", None, ("kernels",)),
    ("GET", "sandfork/api/snapshots", None, ("kernels", "sessions")),
    ("POST", "sandfork/api/snapshots", {}, ("kernels",)),
    ("PATCH", f"sandfork/api/snapshots/{SNAP}", {"name": "n"}, ()),
    ("DELETE", f"sandfork/api/snapshots/{SNAP}", None, ()),
    ("POST", f"sandfork/api/snapshots/{SNAP}/restore", {}, ("contents", "kernels", "sessions")),
    ("POST", "sandfork/api/forks", {}, ("contents", "kernels", "sessions")),
    ("GET", "sandfork/api/operations/op1", None, ()),
    ("GET", "sandfork/api/config", None, ("kernelspecs",)),
    ("GET", f"sandfork/api/snapshots/{SNAP}/inventory", None, ()),
    ("GET", f"sandfork/api/snapshots/{SNAP}/diff/{SNAP}", None, ()),
]


def test_the_table_has_every_endpoint_of_the_extension() -> None:
    handled = {
        (method, handler)
        for _, handler in HANDLERS
        for method in ("GET", "POST", "PATCH", "PUT", "DELETE")
        if getattr(handler, method.lower()) is not getattr(APIHandler, method.lower())
    }
    listed = set()
    for method, path, _, _ in ENDPOINTS:
        matches = [h for pattern, h in HANDLERS if re.fullmatch(pattern, "/" + path)]
        assert len(matches) == 1, path
        listed.add((method, matches[0]))
    assert listed == handled


async def test_every_endpoint_needs_authentication(jp_fetch: Fetch) -> None:
    for method, path, body, _ in ENDPOINTS:
        status, data = await call(jp_fetch, method, path, body, headers={"Authorization": ""})
        assert status == 403, (method, path, status, data)


async def test_a_valid_xsrf_token_without_login_is_refused_by_authentication(
    jp_fetch: Fetch,
) -> None:
    """The XSRF check passes (cookie and header agree), so the 403 is authentication's."""
    token = uuid.uuid4().hex
    xsrf = {"Authorization": "", "Cookie": f"_xsrf={token}", "X-XSRFToken": token}
    for method, path, body, _ in ENDPOINTS:
        status, data = await call(jp_fetch, method, path, body, headers=dict(xsrf))
        assert status == 403, (method, path, status, data)
        assert "xsrf" not in json.dumps(data).lower(), (method, path, data)
    # The control: without the token, a POST is refused by the XSRF check itself.
    status, data = await call(jp_fetch, "POST", "sandfork/api/forks", headers={"Authorization": ""})
    assert status == 403 and "xsrf" in json.dumps(data).lower(), data


async def test_every_endpoint_needs_authorization(jp_fetch: Fetch) -> None:
    for method, path, body, resources in ENDPOINTS:
        status, _ = await call(jp_fetch, method, path, body, headers={"X-Deny": "sandfork"})
        assert status == 403, (method, path, status)
        # What it does or shows of the server's kernels, sessions, contents needs those rights.
        for resource in resources:
            status, data = await call(jp_fetch, method, path, body, headers={"X-Deny": resource})
            assert status == 403 and resource in data["message"], (path, resource, data)
        # The control: a right it does not need is not asked for.
        status, data = await call(jp_fetch, method, path, body, headers={"X-Deny": "terminals"})
        assert status != 403, (method, path, data)


def _nested(depth: int) -> str:
    return '{"kernel_id": "k", "notebook": ' + '{"a": ' * depth + "1" + "}" * depth + "}"


async def test_bad_input_gets_a_4xx_with_a_message(jp_fetch: Fetch) -> None:
    notebook = nbformat.v4.new_notebook()
    fine = {"kernel_id": "nope", "path": "a.ipynb", "notebook": notebook}
    cases: list[tuple[str, str, Any, int, str]] = [
        ("GET", "sandfork/api/kernels/nope", None, 404, "no kernel"),
        ("POST", "sandfork/api/snapshots", {"path": "a.ipynb"}, 400, "kernel_id"),
        ("POST", "sandfork/api/snapshots", "not json", 400, "JSON"),
        ("POST", "sandfork/api/snapshots", "[1]", 400, "object"),
        ("POST", "sandfork/api/forks", {"notebook": notebook}, 400, "kernel_id"),
        ("GET", f"sandfork/api/snapshots/{SNAP}", None, 405, ""),
        ("PATCH", f"sandfork/api/snapshots/{SNAP}", {"name": "x"}, 404, "no snap"),
        ("PATCH", "sandfork/api/snapshots/bogus", {"name": "x"}, 404, "no snapshot"),
        ("DELETE", f"sandfork/api/snapshots/{SNAP}", None, 404, "no snapshot"),
        ("POST", f"sandfork/api/snapshots/{SNAP}/restore", {}, 404, "no snap"),
        ("POST", "sandfork/api/snapshots/bogus/restore", {"operation": 5}, 400, "operation"),
        ("GET", "sandfork/api/operations/unknown", None, 404, "no operation"),
        ("GET", "sandfork/api/snapshots/bogus/inventory", None, 404, "no snapshot"),
        ("GET", f"sandfork/api/snapshots/{SNAP}/inventory", None, 404, "no snap"),
        ("GET", f"sandfork/api/snapshots/bogus/diff/{SNAP}", None, 404, "no snap"),
        # Bodies, by the engine's rule (strict_json): depth, size, repeated keys, NaN.
        ("POST", "sandfork/api/forks", "[" * 100_000, 400, "nests deeper than 64"),
        ("POST", "sandfork/api/forks", _nested(2000), 400, "nests deeper than 64"),
        ("POST", "sandfork/api/forks", _nested(70), 400, "nests deeper than 64"),
        ("POST", "sandfork/api/snapshots", "[" * 100_000, 400, "nests deeper"),
        ("POST", "sandfork/api/snapshots", '{"kernel_id": "a", "kernel_id": "b"}', 400, "twice"),
        ("PATCH", f"sandfork/api/snapshots/{SNAP}", '{"name": "a", "name": "b"}', 400, "'name'"),
        ("POST", "sandfork/api/forks", '{"kernel_id": "k", "count": NaN}', 400, "NaN"),
        ("POST", f"sandfork/api/snapshots/{SNAP}/restore", "x" * 2**21, 413, "limit of 1048576"),
        ("POST", "sandfork/api/snapshots/bogus/restore", b"\xff\xfe", 400, "not valid JSON"),
        # Types and bounds of the fields.
        ("POST", "sandfork/api/snapshots", {"kernel_id": 5}, 400, "kernel_id"),
        ("POST", "sandfork/api/snapshots", {"kernel_id": ""}, 400, "kernel_id"),
        ("POST", "sandfork/api/forks", {"kernel_id": "k" * 1000}, 400, "longer than 128"),
        ("GET", "sandfork/api/kernels/" + "k" * 5000, None, 404, "no kernel"),
        ("PATCH", f"sandfork/api/snapshots/{SNAP}", {"name": 5}, 400, "name"),
        ("PATCH", f"sandfork/api/snapshots/{SNAP}", {"name": "a\u202eb"}, 400, "U+202E"),
        ("PATCH", f"sandfork/api/snapshots/{SNAP}", {"name": " \u3000 "}, 400, "only spaces"),
        ("PATCH", f"sandfork/api/snapshots/{SNAP}", {"name": "\u2067x"}, 400, "ISOLATE"),
        ("POST", "sandfork/api/forks", fine | {"path": 5}, 400, "path"),
        ("POST", "sandfork/api/forks", fine | {"path": "a\x00.ipynb"}, 400, "control"),
        ("POST", "sandfork/api/forks", fine | {"path": "a\n.ipynb"}, 400, "control"),
        ("POST", "sandfork/api/forks", fine | {"path": "/etc/a.ipynb"}, 400, "relative"),
        ("POST", "sandfork/api/forks", fine | {"path": "a/../../b.ipynb"}, 400, "root"),
        ("POST", "sandfork/api/forks", fine | {"path": "n" * 250 + ".ipynb"}, 400, "200 bytes"),
        ("POST", "sandfork/api/forks", fine | {"path": "d/" * 600 + "a.ipynb"}, 400, "1024"),
        ("POST", "sandfork/api/forks", fine | {"notebook": []}, 400, "notebook"),
        ("POST", "sandfork/api/forks", fine | {"count": "2"}, 400, "count"),
        ("POST", "sandfork/api/snapshots", fine | {"operation": ["x"]}, 400, "operation"),
    ]
    for method, path, body, expected, message in cases:
        status, data = await call(jp_fetch, method, path, body)
        assert status == expected, (method, path[:80], status, data)
        assert message in (data or {}).get("message", ""), (method, path[:80], data)


async def test_config_has_the_branch_limit_and_the_sandfork_kernels(
    jp_fetch: Fetch, jp_data_dir: Path
) -> None:
    # A kernelspec of another name that runs the proxy kernel is a Sandfork kernel too.
    spec = json.loads((jp_data_dir / "kernels" / "sandfork" / "kernel.json").read_text())
    (jp_data_dir / "kernels" / "sandfork-large").mkdir()
    (jp_data_dir / "kernels" / "sandfork-large" / "kernel.json").write_text(json.dumps(spec))
    status, data = await call(jp_fetch, "GET", "sandfork/api/config")
    assert status == 200
    # python3 (ipykernel) is a kernelspec of this server too, and is not listed.
    assert data == {"max_branches": 8, "kernel_names": ["sandfork", "sandfork-large"]}


async def test_a_kernel_that_is_not_sandfork_is_refused(jp_fetch: Fetch) -> None:
    kernel = await start_session(jp_fetch, "plain.ipynb", "python3")
    status, data = await call(jp_fetch, "GET", f"sandfork/api/kernels/{kernel}")
    assert status == 400 and "not a Sandfork kernel" in data["message"]
    body = {"kernel_id": kernel, "path": "plain.ipynb", "notebook": nbformat.v4.new_notebook()}
    status, data = await call(jp_fetch, "POST", "sandfork/api/snapshots", body)
    assert status == 400 and "not a Sandfork kernel" in data["message"]
    status, data = await call(jp_fetch, "POST", "sandfork/api/forks", body)
    assert status == 400 and "not a Sandfork kernel" in data["message"]


@pytest.mark.vm
async def test_snapshot_restore_fork_rename_delete(
    jp_fetch: Fetch, jp_serverapp: Any, jp_root_dir: Path, engine: EngineProcess
) -> None:
    (jp_root_dir / "work").mkdir()
    kernel = await start_session(jp_fetch, "work/analysis.ipynb", "sandfork")
    info = await attached(jp_fetch, kernel)
    assert (
        info["sandbox"]["accelerator"] in ("tcg", "kvm", "native")
        and info["sandbox"]["memory_mb"] > 0
    )
    sandbox = info["sandbox"]["id"]
    await run(jp_serverapp, kernel, "x = 41")
    document = notebook("x = 41", "print(x)")

    # Bad input on a real Sandfork kernel.
    base: dict[str, Any] = {"kernel_id": kernel, "path": "work/analysis.ipynb"}
    base["notebook"] = document
    changes: list[tuple[dict[str, Any], str]] = [
        ({"name": "\x01"}, "name"),
        ({"name": ""}, "name"),
        ({"path": "../up.ipynb"}, "root"),
        ({"path": "no-suffix"}, ".ipynb"),
        ({"notebook": {"cells": "no"}}, "notebook"),
        ({"operation": "bad id!"}, "operation"),
    ]
    for change, message in changes:
        status, data = await call(jp_fetch, "POST", "sandfork/api/snapshots", base | change)
        assert status == 400 and message in data["message"], (change, data)
    for count in (0, 9, "2", True):
        status, data = await call(jp_fetch, "POST", "sandfork/api/forks", base | {"count": count})
        assert status == 400 and "count" in data["message"], (count, data)

    # Snapshot, with progress readable under the operation id.
    op = uuid.uuid4().hex
    body = base | {"name": "before", "operation": op}
    status, snap = await call(jp_fetch, "POST", "sandfork/api/snapshots", body)
    assert status == 201, snap
    assert snap["name"] == "before" and snap["sandbox_id"] == sandbox and snap["has_notebook"]
    assert snap["notebook_path"] == "work/analysis.ipynb" and snap["kernel_id"] == kernel
    status, progress = await call(jp_fetch, "GET", f"sandfork/api/operations/{op}")
    assert status == 200 and progress["state"] == "done" and progress["done"] == progress["total"]
    await run(jp_serverapp, kernel, "x += 1")

    # Restore into a new notebook: the stored document, a session, an attached kernel.
    # The engine is held while it restores (and holds the snapshot): deleting it is a 409.
    op = uuid.uuid4().hex
    with engine.holding("restore.in_use") as parked:
        restore = asyncio.ensure_future(
            call(
                jp_fetch, "POST", f"sandfork/api/snapshots/{snap['id']}/restore", {"operation": op}
            )
        )
        await wait_step(jp_fetch, op, "restoring the sandbox")
        await asyncio.to_thread(parked)
        status, data = await call(jp_fetch, "DELETE", f"sandfork/api/snapshots/{snap['id']}")
        assert status == 409 and "being restored" in data["message"], data
    status, restored = await restore
    assert status == 201, restored
    assert restored["path"] == "work/analysis-restored-1.ipynb"
    saved = nbformat.read(jp_root_dir / restored["path"], as_version=4)
    assert [c.source for c in saved.cells] == ["x = 41", "print(x)"]
    assert restored["session"]["path"] == restored["path"]
    assert restored["session"]["kernel"]["id"] == restored["kernel_id"]
    assert await run(jp_serverapp, restored["kernel_id"], "print(x)") == "41\n"
    assert await run(jp_serverapp, kernel, "print(x)") == "42\n"
    status, again = await call(jp_fetch, "POST", f"sandfork/api/snapshots/{snap['id']}/restore")
    assert status == 201 and again["path"] == "work/analysis-restored-2.ipynb"

    # Fork the live notebook into two branches, each with its own sandbox holding x.
    op = uuid.uuid4().hex
    body = base | {"count": 2, "operation": op}
    status, fork = await call(jp_fetch, "POST", "sandfork/api/forks", body)
    assert status == 201, fork
    paths = [b["path"] for b in fork["branches"]]
    assert paths == ["work/analysis-branch-1.ipynb", "work/analysis-branch-2.ipynb"]
    children = {b["sandbox_id"] for b in fork["branches"]}
    assert len(children) == 2 and sandbox not in children
    for branch in fork["branches"]:
        assert await run(jp_serverapp, branch["kernel_id"], "x += 100; print(x)") == "142\n"
    assert await run(jp_serverapp, kernel, "print(x)") == "42\n"
    # Every sandbox a kernel owns is leased: it goes if its kernel vanishes (test_leases.py).
    for sandbox_id in (sandbox, restored["sandbox_id"], *children):
        assert Sandbox.get(sandbox_id, engine.client()).lease_seconds == 60, sandbox_id

    # The lineage: which notebook and sandbox made the snapshot, what came from it.
    status, lineage = await call(jp_fetch, "GET", "sandfork/api/snapshots")
    assert status == 200
    listed = {s["id"]: s for s in lineage["snapshots"]}
    assert listed[snap["id"]]["notebook_path"] == "work/analysis.ipynb"
    nodes = {n["id"]: n for n in lineage["sandboxes"]}
    assert nodes[sandbox]["kernel_id"] == kernel
    assert nodes[sandbox]["notebook_path"] == "work/analysis.ipynb"
    assert nodes[restored["sandbox_id"]]["from_snapshot"] == snap["id"]
    assert nodes[restored["sandbox_id"]]["notebook_path"] == restored["path"]
    for branch in fork["branches"]:
        assert nodes[branch["sandbox_id"]]["forked_from"] == sandbox
        assert nodes[branch["sandbox_id"]]["notebook_path"] == branch["path"]

    # Rename and delete.
    path = f"sandfork/api/snapshots/{snap['id']}"
    status, renamed = await call(jp_fetch, "PATCH", path, {"name": "renamed"})
    assert status == 200 and renamed["name"] == "renamed"
    status, data = await call(jp_fetch, "PATCH", path, {"name": "x" * 201})
    assert status == 400 and "name" in data["message"]
    status, _ = await call(jp_fetch, "DELETE", path)
    assert status == 204
    status, lineage = await call(jp_fetch, "GET", "sandfork/api/snapshots")
    assert snap["id"] not in {s["id"] for s in lineage["snapshots"]}
    # The restored notebook does not depend on the deleted snapshot.
    assert await run(jp_serverapp, restored["kernel_id"], "print(x * 2)") == "82\n"

    # Shutting a branch's session down kills the sandbox its kernel owns.
    first = fork["branches"][0]
    status, _ = await call(jp_fetch, "DELETE", f"api/sessions/{first['session']['id']}")
    assert status == 204
    assert first["sandbox_id"] not in {s.id for s in Sandbox.list(client=engine.client())}


@pytest.mark.vm
async def test_a_failed_restore_leaves_nothing_behind(
    jp_fetch: Fetch,
    jp_serverapp: Any,
    jp_root_dir: Path,
    engine: EngineProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = await start_session(jp_fetch, "nb.ipynb", "sandfork")
    await attached(jp_fetch, kernel)
    body = {"kernel_id": kernel, "path": "nb.ipynb", "notebook": notebook("y = 1")}
    status, snap = await call(jp_fetch, "POST", "sandfork/api/snapshots", body)
    assert status == 201, snap
    files = _files(jp_root_dir)
    sessions = await call(jp_fetch, "GET", "api/sessions")
    kernels = set(jp_serverapp.kernel_manager.list_kernel_ids())
    sandboxes = {s["id"] for s in engine.client().request("GET", "/sandboxes")["items"]}

    # The new kernel cannot reach the engine (a wrong key in its environment): it never attaches.
    monkeypatch.setenv("SANDFORK_API_KEY", "wrong")
    op = uuid.uuid4().hex
    path = f"sandfork/api/snapshots/{snap['id']}/restore"
    status, data = await call(jp_fetch, "POST", path, {"operation": op})
    assert status == 500 and "exited" in data["message"], data
    status, progress = await call(jp_fetch, "GET", f"sandfork/api/operations/{op}")
    assert progress["state"] == "failed" and "exited" in progress["error"]

    assert _files(jp_root_dir) == files
    assert await call(jp_fetch, "GET", "api/sessions") == sessions
    assert set(jp_serverapp.kernel_manager.list_kernel_ids()) == kernels
    after = {s["id"] for s in engine.client().request("GET", "/sandboxes")["items"]}
    assert after == sandboxes


@pytest.mark.vm
async def test_a_restore_whose_folder_is_gone_lands_in_the_root(
    jp_fetch: Fetch, jp_root_dir: Path
) -> None:
    (jp_root_dir / "old").mkdir()
    kernel = await start_session(jp_fetch, "old/nb.ipynb", "sandfork")
    await attached(jp_fetch, kernel)
    body = {"kernel_id": kernel, "path": "old/nb.ipynb", "notebook": notebook("z = 7")}
    status, snap = await call(jp_fetch, "POST", "sandfork/api/snapshots", body)
    assert status == 201, snap
    (jp_root_dir / "old").rmdir()
    status, restored = await call(jp_fetch, "POST", f"sandfork/api/snapshots/{snap['id']}/restore")
    assert status == 201, restored
    assert restored["path"] == "nb-restored-1.ipynb"
    assert (jp_root_dir / "nb-restored-1.ipynb").exists()


class _NoRootCheck(AsyncLargeFileManager):
    """A contents manager that keeps no path inside the root itself (as a custom one may
    not): the extension's own path check is all that holds. It saves a notebook where the
    path points, and nothing else (no checkpoint, no model read back)."""

    def _get_os_path(self, path: str) -> str:
        return os.path.join(self.root_dir, path)

    async def save(self, model: dict[str, Any], path: str = "") -> dict[str, Any]:
        await self._save_notebook(self._get_os_path(path), nbformat.from_dict(model["content"]))
        return {"path": path}


@pytest.mark.vm
async def test_a_restore_checks_the_snapshots_notebook_and_path_before_writing(
    jp_fetch: Fetch, jp_serverapp: Any, jp_root_dir: Path, engine: EngineProcess, tmp_path: Path
) -> None:
    """A snapshot's notebook attachment and notebook_path metadata are whatever a client with
    the engine's key wrote: each bad one is a 422 before any sandbox, file or kernel."""
    manager = _NoRootCheck(parent=jp_serverapp, root_dir=str(jp_root_dir))
    jp_serverapp.contents_manager = manager
    outside = tmp_path / "outside"
    outside.mkdir()
    # The control: this manager itself writes wherever it is told.
    model = {"type": "notebook", "format": "json", "content": nbformat.v4.new_notebook()}
    await manager.save(model, "../outside/probe.ipynb")
    assert (outside / "probe.ipynb").exists()
    (outside / "probe.ipynb").unlink()

    good = json.dumps(notebook("w = 1"))
    cases: list[tuple[str | None, str, str]] = [
        ("../outside/escape.ipynb", good, "leaves the server's root"),
        ("work/../../outside/escape.ipynb", good, "leaves the server's root"),
        (f"{outside}/escape.ipynb", good, "relative to the server's root"),
        ("bell\x07.ipynb", good, "control characters"),
        ("n" * 250 + ".ipynb", good, "longer than 200 bytes"),
        ("d/" * 600 + "x.ipynb", good, "longer than 1024 bytes"),
        ("not-an-ipynb.txt", good, "ending in .ipynb"),
        (None, "this is not JSON", "the snapshot's notebook is not valid JSON"),
        (None, "[1, 2]", "the snapshot's notebook must be a notebook document"),
        (None, '{"cells": 5}', "the snapshot's notebook is not a valid notebook"),
        (None, "[" * 100_000, "the snapshot's notebook nests deeper than 64"),
        (None, '{"nbformat": 4, "nbformat": 4}', "the key 'nbformat' appears twice"),
        (None, '{"nbformat": NaN}', "NaN is not a JSON number"),
    ]
    client = engine.client()
    sandbox = client.request("POST", "/sandboxes", json={})["id"]
    try:
        snapshots = []
        for path, document, _ in cases:
            metadata = {} if path is None else {"notebook_path": path}
            body = {"metadata": metadata, "attachments": {"notebook.ipynb": document}}
            snap = client.request("POST", f"/sandboxes/{sandbox}/snapshots", json=body)
            snapshots.append(snap["id"])
        sandboxes = engine.sandbox_ids()
        kernels = set(jp_serverapp.kernel_manager.list_kernel_ids())
        for snap_id, (path, _, message) in zip(snapshots, cases, strict=True):
            restore = f"sandfork/api/snapshots/{snap_id}/restore"
            status, data = await call(jp_fetch, "POST", restore)
            assert status == 422 and message in data["message"], (str(path)[:80], data)
        assert engine.sandbox_ids() == sandboxes  # refused before the restore
        assert set(jp_serverapp.kernel_manager.list_kernel_ids()) == kernels
        assert _files(jp_root_dir) == [] and list(outside.iterdir()) == []
    finally:
        client.request("DELETE", f"/sandboxes/{sandbox}")


# -- helpers ---------------------------------------------------------------------------------


def _files(root: Path) -> list[str]:
    """Every file under ``root`` (Jupyter's checkpoint copies included; empty folders not)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
