"""``sandfork snapshot export`` / ``import``: one file between engines, damage refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
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
    assert done.stdout.strip() == snapshot_id
    client = own_engine.client()
    imported = Snapshot.get(snapshot_id, client=client)
    assert imported.name == "portable"
    data = client.request("GET", f"/snapshots/{snapshot_id}")
    assert data["metadata"] == {"notebook_path": "a.ipynb"}
    assert data["attachments"] == ["notebook.ipynb"]
    attachment = client.raw("GET", f"/snapshots/{snapshot_id}/attachments/notebook.ipynb")
    assert attachment.content == b'{"cells": []}'
    restored = Sandbox.create(from_snapshot=snapshot_id, client=client)
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
    assert not list((own_engine.home / "snapshots").iterdir())
    assert not list((own_engine.home / "layers").iterdir())  # nothing half-imported stays
