"""Limits with clear errors, private files, and one scratch folder per engine."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.backends.vm.qemu import default_ram_dir
from sandfork.sdk import LimitExceeded, Sandbox


@pytest.fixture
def limited_engine(
    tmp_path_factory: pytest.TempPathFactory, template: None
) -> Iterator[EngineProcess]:
    """An engine allowing 3 sandboxes, 2600 MiB of memory in all and 50 MiB of snapshots."""
    engine = EngineProcess(
        tmp_path_factory.mktemp("limited"),
        "--EngineConfig.max_sandboxes=3",
        "--EngineConfig.max_total_memory_mb=2600",
        "--EngineConfig.snapshot_quota_mb=50",
    )
    engine.start()
    yield engine
    engine.close()


def _refused(call: object, words: str) -> None:
    with pytest.raises(LimitExceeded) as caught:
        call()  # type: ignore[operator]
    assert words in str(caught.value), caught.value


@pytest.mark.vm
def test_limits_refuse_before_starting(limited_engine: EngineProcess) -> None:
    client = limited_engine.client()
    made = [Sandbox.create(client=client), Sandbox.create(client=client)]  # 2 x 1024 MiB
    try:
        _refused(lambda: Sandbox.create(client=client), "limit is 2600 MiB")
        made.append(Sandbox.create(memory_mb=512, client=client))  # 2560 MiB: fits
        _refused(lambda: Sandbox.create(memory_mb=256, client=client), "limit is 3")
        before = limited_engine.sandbox_ids()
        _refused(lambda: made[0].fork_tree(2), "limit is 3")
        # refused before it started: no child, no capture in the RAM folder
        assert limited_engine.sandbox_ids() == before
        assert list((limited_engine.ram_dir / "staging").glob("*")) == []
        # A snapshot stores what changed since the template's boot: 80 MB of new data.
        made[0].create_code_context().run_code("import numpy as np; x = np.ones(10_000_000)")
        _refused(lambda: made[0].snapshot(), "the quota is 50 MiB")
        assert client.request("GET", "/snapshots")["snapshots"] == []
        response = limited_engine.get("/v1/sandboxes")
        assert response.status_code == 200 and len(response.json()["items"]) == 3
    finally:
        for sandbox in made:
            sandbox.kill()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.vm
def test_engine_files_are_private(own_engine: EngineProcess) -> None:
    sandbox = Sandbox.create(client=own_engine.client())
    try:
        snapshot_id = sandbox.snapshot().id
        home = own_engine.home
        assert _mode(home) == 0o700
        assert _mode(home / "engine.sqlite") == 0o600  # the ledger holds command output
        assert list((home / "layers").glob("*.mem")), "the snapshot's memory is a layer"
        for folder in (home / "snapshots", home / "layers", home / "sandboxes"):
            assert _mode(folder) == 0o700, folder
        for path in [*(home / "snapshots" / snapshot_id).iterdir(), *(home / "layers").iterdir()]:
            assert _mode(path) & 0o077 == 0, path
    finally:
        sandbox.kill()
    own_engine.client().request("DELETE", f"/snapshots/{snapshot_id}")


def test_each_engine_has_its_own_scratch_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDFORK_RAM_DIR", raising=False)
    first, second = default_ram_dir(Path("/srv/a")), default_ram_dir(Path("/srv/b"))
    assert first != second
    assert (
        first.parent == second.parent == Path("/dev/shm") / f"sandfork-{__import__('os').getuid()}"
    )
    assert default_ram_dir(Path("/srv/a")) == first  # stable across restarts
