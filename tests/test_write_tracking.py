"""Guest page tracking: a capture reads the pages written since the previous capture.

The first tests run the preload library in a plain Python process that maps a file privately,
as QEMU maps a memory image, and check what the engine's scans report. The VM tests take a
long-running sandbox (created from the template, then 200 MB written) through ten captures
with changes between, across an engine restart (an adopted VM is no longer tracked until its
next capture), and check that every capture restores to exactly its own state while the
sandbox, its kernel and a running command go on untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.backends.vm.process_memory import RamMapping
from sandfork.backends.vm.write_tracking import WriteTracker, preload_environment, preload_library
from sandfork.sdk import Sandbox, Snapshot

PAGES = 256
_CHILD = f"""
import mmap, sys
with open(sys.argv[1], "r+b") as f:
    ram = mmap.mmap(f.fileno(), {PAGES} * 4096, flags=mmap.MAP_PRIVATE)
for line in sys.stdin:
    verb, *pages = line.split()
    for page in map(int, pages):
        if verb == "write":
            ram[page * 4096 + 7] = 1
        else:
            ram[page * 4096 + 7]
    print("done", flush=True)
"""


class Mapper:
    """A process mapping ``image`` privately (copy-on-write), told which pages to touch."""

    def __init__(self, image: Path, environment: dict[str, str]) -> None:
        self.image = image
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(image)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **environment},
        )
        self.touch("read")  # the file is mapped once this answers

    def touch(self, verb: str, *pages: int) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(" ".join([verb, *map(str, pages)]) + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline() == "done\n"

    def tracker(self) -> WriteTracker:
        return WriteTracker(RamMapping.find(self.process.pid, self.image))


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "memory.img"
    with path.open("wb") as f:
        f.truncate(PAGES * 4096)
    return path


@pytest.fixture
def mappers() -> Iterator[list[Mapper]]:
    made: list[Mapper] = []
    yield made
    for mapper in made:
        mapper.process.kill()
        mapper.process.wait()


def _kernel_tracks() -> str | None:
    release = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
    if release < (6, 7):
        return f"PAGEMAP_SCAN needs Linux 6.7 or later; this is {os.uname().release}"
    if preload_library() is None:
        return "the preload library could not be built (no C compiler?)"
    return None


def test_a_scan_reports_the_pages_written_since_the_last_one(
    image: Path, mappers: list[Mapper]
) -> None:
    if (why := _kernel_tracks()) is not None:
        pytest.skip(why)
    mapper = Mapper(image, preload_environment(image))
    mappers.append(mapper)
    tracker = mapper.tracker()
    assert tracker.available()
    mapper.touch("write", 3, 4, 200)
    tracker.take()  # from here on, only what follows counts
    mapper.touch("read", 1, 2, 9, 250)
    mapper.touch("write", 4, 5, 100)
    assert tracker.written().tolist() == [4, 5, 100]
    assert tracker.written().tolist() == [4, 5, 100]  # looking changes nothing
    assert tracker.take().tolist() == [4, 5, 100]
    assert tracker.take().tolist() == []
    mapper.touch("write", 5)
    assert tracker.take().tolist() == [5]
    # What the guest ever wrote is still told apart from the image's pages.
    assert mapper.tracker().ram.written_pages().tolist() == [3, 4, 5, 100, 200]


def test_only_the_named_image_is_tracked(
    image: Path, tmp_path: Path, mappers: list[Mapper]
) -> None:
    if (why := _kernel_tracks()) is not None:
        pytest.skip(why)
    other = tmp_path / "other.img"
    other.write_bytes(bytes(PAGES * 4096))
    untracked = Mapper(image, preload_environment(other))
    plain = Mapper(image, {})
    mappers += [untracked, plain]
    assert not untracked.tracker().available()
    assert not plain.tracker().available()


MIB = 2**20
SETUP = (
    "import hashlib, numpy as np\n"
    "held = np.random.default_rng(5).integers(0, 255, 200 * 2**20, dtype=np.uint8)\n"
    "def digests():\n"
    "    return (hashlib.sha256(held).hexdigest(),\n"
    "            hashlib.sha256(open('/root/step.txt', 'rb').read()).hexdigest())\n"
    "open('/root/step.txt', 'w').write('0')\n"
)
CHANGE = (  # 2 MB of the array and the disk file, different at every step
    "held[{step} * 2_000_000 : {step} * 2_000_000 + 2_000_000] += {step}\n"
    "open('/root/step.txt', 'w').write('{step}' * 1000)\n"
)


def _run(sandbox: Sandbox, code: str) -> str:
    result = sandbox.create_code_context().run_code(code)
    assert result.error is None, result.error
    return result.text


def _digests(sandbox: Sandbox) -> tuple[str, str]:
    memory, disk = eval(_run(sandbox, "digests()"))  # two hex strings from our own code
    return memory, disk


def _tracked(engine: EngineProcess, sandbox: Sandbox) -> bool:
    pid = engine.sandbox_pid(sandbox.id)
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    backend = next(a for a in args if a.startswith("memory-backend-file,"))
    image = Path(backend.split("mem-path=")[1].split(",")[0])
    return WriteTracker(RamMapping.find(pid, image)).available()


@pytest.mark.vm
@pytest.mark.vm_only
def test_ten_captures_of_a_long_running_sandbox_each_restore_exactly(
    own_engine: EngineProcess,
) -> None:
    if (why := _kernel_tracks()) is not None:
        pytest.skip(why)
    client = own_engine.client()
    sandbox = Sandbox.create(memory_mb=1024, client=client)
    output: list[str] = []
    exit_codes: list[int] = []

    def stream() -> None:  # a command running through the first five captures
        script = "while [ ! -e /tmp/stop ]; do echo tick; sleep 0.1; done; echo end"
        exit_codes.append(sandbox.exec_stream(script, on_stdout=output.append))

    try:
        _run(sandbox, SETUP)
        assert _tracked(own_engine, sandbox)
        streaming = threading.Thread(target=stream, daemon=True)
        streaming.start()
        captures: list[tuple[str, tuple[str, str]]] = []
        for step in range(1, 11):
            if step == 6:  # an adopted VM is compared whole once, then tracked again
                sandbox.exec("touch /tmp/stop", check=True)
                streaming.join(600)  # a bound for a hang, not a speed
                assert exit_codes == [0]
                assert "".join(output).split()[-1] == "end"
                own_engine.stop()
                own_engine.start()
                sandbox.client = client = own_engine.client()
                assert _tracked(own_engine, sandbox)  # QEMU kept its registration
            _run(sandbox, CHANGE.format(step=step))
            snap = Snapshot.get(sandbox.snapshot(f"step {step}").id, client=client)
            captures.append((snap.id, _digests(sandbox)))
            if step > 1:  # the first stores the 200 MB, the others what changed (a fifth
                # delta over a full image holds what the four below it held too)
                assert snap.size_bytes < 100 * MIB, (step, snap.size_bytes)
        assert _run(sandbox, "int(held.size)") == str(200 * MIB)  # the kernel went on
        for snapshot_id, expected in captures:
            restored = Sandbox.create(from_snapshot=snapshot_id, client=client)
            try:
                assert _digests(restored) == expected, snapshot_id
            finally:
                restored.kill()
    finally:
        sandbox.kill()
