"""The Jupyter server extension's REST handlers (docs/jupyter-api.md) in a real Jupyter Server
(pytest-jupyter), with real Sandfork kernels, a real engine and real VMs."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import nbformat
import pytest

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
from sandfork.sdk import Sandbox

ENDPOINTS = [
    ("GET", "sandfork/api/kernels/k1", None),
    ("GET", "sandfork/api/snapshots", None),
    ("POST", "sandfork/api/snapshots", {}),
    ("PATCH", "sandfork/api/snapshots/snap_0123456789abcdef", {"name": "n"}),
    ("DELETE", "sandfork/api/snapshots/snap_0123456789abcdef", None),
    ("POST", "sandfork/api/snapshots/snap_0123456789abcdef/restore", {}),
    ("POST", "sandfork/api/forks", {}),
    ("GET", "sandfork/api/operations/op1", None),
    ("GET", "sandfork/api/config", None),
    ("GET", "sandfork/api/snapshots/snap_0123456789abcdef/inventory", None),
    ("GET", "sandfork/api/snapshots/snap_0123456789abcdef/diff/snap_0123456789abcdef", None),
]


async def test_every_endpoint_needs_authentication(jp_fetch: Fetch) -> None:
    for method, path, body in ENDPOINTS:
        status, data = await call(jp_fetch, method, path, body, headers={"Authorization": ""})
        assert status == 403, (method, path, status, data)


async def test_a_valid_xsrf_token_without_login_is_refused_by_authentication(
    jp_fetch: Fetch,
) -> None:
    """The XSRF check passes (cookie and header agree), so the 403 is authentication's."""
    token = uuid.uuid4().hex
    xsrf = {"Authorization": "", "Cookie": f"_xsrf={token}", "X-XSRFToken": token}
    for method, path, body in ENDPOINTS:
        status, data = await call(jp_fetch, method, path, body, headers=dict(xsrf))
        assert status == 403, (method, path, status, data)
        assert "xsrf" not in json.dumps(data).lower(), (method, path, data)
    # The control: without the token, a POST is refused by the XSRF check itself.
    status, data = await call(jp_fetch, "POST", "sandfork/api/forks", headers={"Authorization": ""})
    assert status == 403 and "xsrf" in json.dumps(data).lower(), data


async def test_every_endpoint_needs_authorization(jp_fetch: Fetch) -> None:
    for method, path, body in ENDPOINTS:
        status, _ = await call(jp_fetch, method, path, body, headers={"X-Deny": "sandfork"})
        assert status == 403, (method, path, status)
    # Restoring and forking make notebooks, kernels and sessions: those rights are needed too.
    for resource in ("contents", "kernels", "sessions"):
        for method, path, body in ENDPOINTS[5:7]:
            status, data = await call(jp_fetch, method, path, body, headers={"X-Deny": resource})
            assert status == 403 and resource in data["message"], (path, resource, data)


async def test_bad_input_gets_a_4xx_with_a_message(jp_fetch: Fetch) -> None:
    notebook = nbformat.v4.new_notebook()
    cases: list[tuple[str, str, Any, int, str]] = [
        ("GET", "sandfork/api/kernels/nope", None, 404, "no kernel"),
        ("POST", "sandfork/api/snapshots", {"path": "a.ipynb"}, 400, "kernel_id"),
        ("POST", "sandfork/api/snapshots", "not json", 400, "JSON"),
        ("POST", "sandfork/api/snapshots", "[1]", 400, "object"),
        ("POST", "sandfork/api/forks", {"notebook": notebook}, 400, "kernel_id"),
        ("GET", "sandfork/api/snapshots/snap_0123456789abcdef", None, 405, ""),
        ("PATCH", "sandfork/api/snapshots/snap_0123456789abcdef", {"name": "x"}, 404, "no snap"),
        ("PATCH", "sandfork/api/snapshots/bogus", {"name": "x"}, 404, "no snapshot"),
        ("DELETE", "sandfork/api/snapshots/snap_0123456789abcdef", None, 404, "no snapshot"),
        ("POST", "sandfork/api/snapshots/snap_0123456789abcdef/restore", {}, 404, "no snap"),
        ("POST", "sandfork/api/snapshots/bogus/restore", {"operation": 5}, 400, "operation"),
        ("GET", "sandfork/api/operations/unknown", None, 404, "no operation"),
        ("GET", "sandfork/api/snapshots/bogus/inventory", None, 404, "no snapshot"),
        ("GET", "sandfork/api/snapshots/snap_0123456789abcdef/inventory", None, 404, "no snap"),
        ("GET", "sandfork/api/snapshots/bogus/diff/snap_0123456789abcdef", None, 404, "no snap"),
    ]
    for method, path, body, expected, message in cases:
        status, data = await call(jp_fetch, method, path, body)
        assert status == expected, (method, path, status, data)
        assert message in (data or {}).get("message", ""), (method, path, data)


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
    assert info["sandbox"]["accelerator"] in ("tcg", "kvm") and info["sandbox"]["memory_mb"] > 0
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


# -- helpers ---------------------------------------------------------------------------------


def _files(root: Path) -> list[str]:
    """Every file under ``root`` (Jupyter's checkpoint copies included; empty folders not)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
