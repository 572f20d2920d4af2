"""``sandfork snapshot export`` / ``import``: one file between engines, damage refused."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from conftest import EngineProcess
from sandfork.sdk import BadRequestError, Sandbox, Snapshot

pytestmark = pytest.mark.vm


def _cli(engine: EngineProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDFORK_API": engine.url, "SANDFORK_API_KEY": engine.api_key}
    return subprocess.run(
        [sys.executable, "-m", "sandfork", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_export_then_import_on_another_engine(
    engine: EngineProcess, own_engine: EngineProcess, tmp_path: Path
) -> None:
    source = Sandbox.create(client=engine.client())
    source.create_code_context().run_code("carried = {'answer': 42}")
    source.filesystem.write("/root/carried.txt", "on disk")
    body = {
        "name": "portable",
        "metadata": {"notebook_path": "a.ipynb"},
        "attachments": {"notebook.ipynb": '{"cells": []}'},
    }
    snapshot_id = engine.client().request("POST", f"/sandboxes/{source.id}/snapshots", json=body)[
        "id"
    ]
    source.kill()
    file = tmp_path / "snap.sfsnap"
    done = _cli(engine, "snapshot", "export", snapshot_id, str(file))
    assert done.returncode == 0, done.stderr
    assert file.stat().st_size > 0

    done = _cli(own_engine, "snapshot", "import", str(file))
    assert done.returncode == 0, done.stderr
    imported_id = done.stdout.strip()
    assert imported_id.startswith("snap_") and imported_id != snapshot_id  # ids are fresh
    client = own_engine.client()
    imported = Snapshot.get(imported_id, client=client)
    assert imported.name == "portable"
    data = client.request("GET", f"/snapshots/{imported_id}")
    assert data["metadata"] == {"notebook_path": "a.ipynb"}
    # The variable inventory the engine took with the snapshot travels with it.
    assert data["attachments"] == ["inventory.json", "notebook.ipynb"]
    carried = imported.inventory().get("carried")
    assert carried is not None and (carried.type, carried.length) == ("dict", 1)
    attachment = client.raw("GET", f"/snapshots/{imported_id}/attachments/notebook.ipynb")
    assert attachment.content == b'{"cells": []}'
    (memory,) = (own_engine.home / "layers").glob("*.mem")  # a full image, standing alone
    assert memory.stat().st_size == 1024 * 2**20  # mapped whole by the VMs restored from it
    assert memory.stat().st_blocks * 512 < memory.stat().st_size  # written sparse
    restored = Sandbox.create(from_snapshot=imported_id, client=client)
    assert restored.create_code_context().run_code("carried['answer']").text == "42"
    assert restored.filesystem.read_text("/root/carried.txt") == "on disk"
    restored.kill()

    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(b ^ 0xFF for b in data[middle : middle + 4096])
    corrupted = tmp_path / "corrupted.sfsnap"
    corrupted.write_bytes(data)
    truncated = tmp_path / "truncated.sfsnap"
    truncated.write_bytes(data[: len(data) * 2 // 3])
    imported.delete()
    for damaged in (corrupted, truncated):
        with pytest.raises(BadRequestError, match=r"corrupted|truncated"):
            Snapshot.import_file(damaged, client=client)
    assert Snapshot.list(client=client) == []
    for folder in ("snapshots", "layers", "tmp"):  # nothing half-imported stays
        path = own_engine.home / folder  # (a deleted snapshot's files go in the background)
        _wait_for(lambda: not list(path.iterdir()), f"an empty {folder} folder")  # noqa: B023


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _in_background(call: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(requests.RequestException):
            call()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_sigkill_during_export_or_import_leaves_nothing(
    own_engine: EngineProcess, tmp_path: Path
) -> None:
    """The engine is killed while an export's file, then an upload, is in its ``tmp`` folder
    (held there: the export's client reads nothing, the upload's body stops half-way); the
    next start removes what it left and keeps the snapshot as it was."""
    client = own_engine.client()
    source = Sandbox.create(client=client)
    snapshot_id = client.request("POST", f"/sandboxes/{source.id}/snapshots", json={})["id"]
    source.kill()
    tmp = own_engine.home / "tmp"
    layers = sorted((own_engine.home / "layers").iterdir())

    export = _in_background(
        lambda: requests.get(
            f"{own_engine.url}/v1/snapshots/{snapshot_id}/export",
            headers=own_engine.auth,
            stream=True,
            timeout=600,
        )
    )
    _wait_for(lambda: any(tmp.glob("export-*/*.sfsnap")), "the export's file")
    own_engine.stop(signal.SIGKILL)
    export.join()
    assert list(tmp.iterdir())  # the killed engine left its export behind ...
    own_engine.start()
    assert list(tmp.iterdir()) == []  # ... and the next one removed it

    file = tmp_path / "snap.sfsnap"
    Snapshot.get(snapshot_id, client=own_engine.client()).export(file)
    release = threading.Event()

    def half_the_file() -> Iterator[bytes]:
        with file.open("rb") as f:
            yield f.read(file.stat().st_size // 2)
        release.wait(600)

    upload = _in_background(
        lambda: requests.post(
            f"{own_engine.url}/v1/snapshots/import",  # the restarted engine's new port
            data=half_the_file(),
            headers=own_engine.auth,
            timeout=600,
        )
    )
    uploads = lambda: list(tmp.glob("upload-*/import.sfsnap"))  # noqa: E731
    _wait_for(lambda: any(p.stat().st_size > 0 for p in uploads()), "the upload")
    own_engine.stop(signal.SIGKILL)
    release.set()
    upload.join()
    assert uploads()
    own_engine.start()
    assert list(tmp.iterdir()) == []
    snapshots = own_engine.client().request("GET", "/snapshots")["snapshots"]
    assert [s["id"] for s in snapshots] == [snapshot_id]
    assert sorted((own_engine.home / "layers").iterdir()) == layers
