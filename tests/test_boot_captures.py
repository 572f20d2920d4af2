"""Template boot captures: the cold-boot path with them off, and damaged ones rebuilt.

Every other test restores the shared, warm capture in the user's cache; these run engines
whose captures live in a directory of their own, so damaging one never touches the shared
cache.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.backends.vm.backend import VmBackend
from sandfork.engine.boot_captures import MANIFEST, BootCaptures
from sandfork.paths import cache_dir
from sandfork.sdk import Client, Sandbox

pytestmark = pytest.mark.vm

StartEngine = Callable[..., EngineProcess]


@pytest.fixture
def start_engine(tmp_path_factory: pytest.TempPathFactory, template: None) -> Iterator[StartEngine]:
    """Starts one engine of this test with extra ``sandfork serve`` flags; closed after it."""
    started: list[EngineProcess] = []

    def start(*args: str) -> EngineProcess:
        assert not started, "one engine per test"
        proc = EngineProcess(tmp_path_factory.mktemp("sandfork-captures"), *args)
        started.append(proc)
        proc.start()
        return proc

    yield start
    for proc in started:
        proc.close()


# What a VM boot capture holds (the backend's layout; its RAM folder is never used here).
VM_FILES = VmBackend(Path(tempfile.mkdtemp(prefix="sandfork-test-ram-")))


def _capture_dirs(root: Path) -> dict[str, bool]:
    """Capture directories under ``root`` and whether each is listed (has a manifest)."""
    return {p.name: (p / MANIFEST).exists() for p in root.iterdir() if not p.name.startswith(".")}


def _shared_capture(client: Client) -> Path:
    """The shared cache's capture the session's engine creates sandboxes from."""
    sb = Sandbox.create(client=client)
    try:
        disk = client.request("GET", f"/sandboxes/{sb.id}")["disk"]
        info = subprocess.run(
            ["qemu-img", "info", "--output=json", "-U", disk],
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        sb.kill()
    capture = Path(json.loads(info.stdout)["full-backing-filename"]).parent
    assert capture.parent == cache_dir() / "boot-captures", capture
    assert BootCaptures.valid(capture, VM_FILES)
    return capture


def _garble(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(b"\xde\xad\xbe\xef" * 64)


def test_cold_boot_without_captures(start_engine: StartEngine, tmp_path: Path) -> None:
    captures = tmp_path / "captures"
    engine = start_engine("--no-boot-captures", "--boot-capture-dir", str(captures))
    client = engine.client()
    sb = Sandbox.create(client=client)
    try:
        assert client.request("GET", f"/sandboxes/{sb.id}")["boot_mode"] == "cold"
        assert sb.create_code_context().run_code("answer = 6 * 7\nanswer").text == "42"
        sb.exec("echo cold > /root/boot.txt", check=True)
        snapshot_id = sb.snapshot("cold").id
        restored = Sandbox.create(from_snapshot=snapshot_id, client=client)
        try:
            assert restored.create_code_context().run_code("answer + 1").text == "43"
            assert restored.filesystem.read_text("/root/boot.txt") == "cold\n"
        finally:
            restored.kill()
    finally:
        sb.kill()
    assert not captures.exists()  # with captures off, none was made


def test_damaged_captures_are_rebuilt(
    start_engine: StartEngine, client: Client, tmp_path: Path
) -> None:
    captures = tmp_path / "captures"
    captures.mkdir()
    shared = _shared_capture(client)
    stem = shared.name.split(".")[0]  # the shared one may be a rebuilt generation: "<stem>.N"
    gen0 = captures / stem
    subprocess.run(["cp", "-a", "--sparse=always", str(shared), str(gen0)], check=True)
    engine = start_engine("--boot-capture-dir", str(captures))
    own = engine.client()
    first = Sandbox.create(client=own)  # from the intact copy: no rebuild
    try:
        assert _capture_dirs(captures) == {gen0.name: True}
        from_first = Sandbox.create(from_snapshot=first.snapshot(), client=own)

        # A short memory image (a damaged copy put in its place: running VMs keep mapping
        # the one they started from) fails the size check: the capture is rebuilt.
        short = gen0 / "memory.short"
        short.write_bytes((gen0 / "memory.img").read_bytes()[: 2**20])
        short.replace(gen0 / "memory.img")
        rebuilt = Sandbox.create(client=own)
        rebuilt.kill()
        gen1 = captures / f"{stem}.1"
        assert _capture_dirs(captures) == {gen0.name: False, gen1.name: True}
        # the discarded capture keeps only the disk and memory sandboxes made from it map
        assert sorted(p.name for p in gen0.iterdir()) == ["disk.qcow2", "memory.img"]
        assert first.exec("echo still").stdout == "still\n"
        assert from_first.exec("echo restored").stdout == "restored\n"
        from_first.kill()

        # (Garbled device state fails the checksum: tests/test_engine_rules.py, in-process.)
        # Damage the checks cannot see (the manifest agrees with it) makes QEMU's restore
        # fail: the capture is discarded and rebuilt, and the sandbox is created all the same.
        _garble(gen1 / "devices.state")
        manifest = json.loads((gen1 / MANIFEST).read_text())
        manifest["sha256"]["devices.state"] = BootCaptures.checksum(gen1 / "devices.state")
        (gen1 / MANIFEST).write_text(json.dumps(manifest))
        assert BootCaptures.valid(gen1, VM_FILES)
        last = Sandbox.create(client=own)
        assert last.exec("echo fine").stdout == "fine\n"
        last.kill()
        gen2 = captures / f"{stem}.2"
        assert _capture_dirs(captures) == {gen0.name: False, gen1.name: False, gen2.name: True}
        assert BootCaptures.valid(gen2, VM_FILES)
    finally:
        first.kill()
