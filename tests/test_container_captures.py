"""Where a container sandbox's captures live and what they report (issue 20).

A fork's capture is dumped into the engine's RAM folder and its copies link their image files
there (nothing of it waits on the disk); a link folder left by a killed supervisor is swept at
the next start; a snapshot's pause is the time CRIU kept the sandbox frozen, read from CRIU's
own statistics, not the time the whole dump took.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.backends.container.sandbox import frozen_seconds
from sandfork.sdk import Sandbox, Snapshot

pytestmark = pytest.mark.container


def _shim_config(engine: EngineProcess, sandbox_id: str) -> dict[str, object]:
    """The configuration a sandbox's supervisor was started with (in its record)."""
    record = json.loads((engine.home / "sandboxes" / sandbox_id / "shim.json").read_text())
    assert record["shim"] == engine.sandbox_pid(sandbox_id)
    config = record["config"]
    assert isinstance(config, dict)
    return config


def test_a_forks_capture_and_its_copies_links_stay_in_ram(container_engine: EngineProcess) -> None:
    client = container_engine.client()
    parent = Sandbox.create(client=client)
    try:
        parent.create_code_context().run_code("held = bytes(range(256)) * 200_000")
        child = parent.fork()
        try:
            restore = _shim_config(container_engine, child.id)["restore"]
            assert isinstance(restore, dict)
            assert Path(restore["links"]).parent == container_engine.ram_dir
            assert Path(restore["images"]).is_relative_to(container_engine.ram_dir)
            run = child.create_code_context().run_code("len(held)")
            assert run.text == "51200000"
        finally:
            child.kill()
        on_disk = list((container_engine.home / "snapshots").rglob("pages-*"))
        assert on_disk == [], f"a fork's capture was written to disk: {on_disk}"
    finally:
        parent.kill()


def test_image_links_of_a_killed_supervisor_are_swept_at_start(
    container_engine: EngineProcess,
) -> None:
    leftover = container_engine.ram_dir / "sbx_0123456789abcdef.images"
    leftover.mkdir()
    (leftover / "pages-1.img").write_bytes(b"\0" * 4096)
    container_engine.stop(signal.SIGKILL)
    container_engine.start()
    assert not leftover.exists()


def test_a_snapshots_pause_is_criu_frozen_time(container_engine: EngineProcess) -> None:
    client = container_engine.client()
    box = Sandbox.create(client=client)
    try:
        box.create_code_context().run_code("x = 1")
        snap = Snapshot.get(box.snapshot(), client=client)
        frozen = frozen_seconds(
            container_engine.home / "sandboxes" / box.id / "dump" / "stats-dump"
        )
        assert frozen is not None, "CRIU's dump statistics were not where they are read"
        assert snap.paused_ms == int(frozen * 1000)
        snap.delete()
    finally:
        box.kill()
