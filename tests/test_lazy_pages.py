"""The lazy-pages server of a container restore (``backends/container/lazy_pages.py``): the
image reading it starts from, fed crafted and hostile images, and a real restored sandbox
that forks, remaps, drops and unmaps memory whose pages have not come yet, its background
copy parked at the hold point ``lazy.background`` until it has; and a capture of a sandbox
whose pages have not all come, which waits for them.
"""

from __future__ import annotations

import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.backends.container.pagemap import (
    PAGE,
    PE_LAZY,
    PE_PARENT,
    PE_PRESENT,
    ImageError,
    Run,
    lazy_runs,
)
from sandfork.backends.container.restoring import WORK
from sandfork.sdk import Sandbox

MAGIC = b"\x00" * 8  # what CRIU writes there is not read
PAGES_AWAITED = "waits for the pages still coming"  # what the engine logs then


def varint(value: int) -> bytes:
    out = b""
    while True:
        byte, value = value & 0x7F, value >> 7
        out += bytes([byte | (0x80 if value else 0)])
        if not value:
            return out


def message(*fields: tuple[int, int | bytes]) -> bytes:
    out = b""
    for number, value in fields:
        if isinstance(value, bytes):
            out += varint(number << 3 | 2) + varint(len(value)) + value
        else:
            out += varint(number << 3) + varint(value)
    return out


def image(path: Path, *entries: bytes) -> None:
    path.write_bytes(MAGIC + b"".join(struct.pack("<I", len(e)) + e for e in entries))


def entry(start: int, pages: int, flags: int) -> bytes:
    return message((1, start), (2, pages), (4, flags))


def mm(*vmas: tuple[int, int]) -> bytes:
    return message((1, 0x400000), *((14, message((1, s), (2, e), (3, 0))) for s, e in vmas))


def images_of(folder: Path, vmas: list[tuple[int, int]], *entries: bytes) -> Path:
    image(folder / "pagemap-7.img", message((1, 3)), *entries)
    image(folder / "mm-7.img", mm(*vmas))
    return folder


def test_lazy_runs_are_cut_at_mappings_and_skip_eager_pages(tmp_path: Path) -> None:
    a, b = 0x10000000, 0x10000000 + 4 * PAGE
    images = images_of(
        tmp_path,
        [(a, b), (b, b + 8 * PAGE)],
        entry(a - 16 * PAGE, 2, PE_PRESENT),  # eager: read by criu restore itself
        entry(a + PAGE, 6, PE_PRESENT | PE_LAZY),  # across two mappings
        entry(b + 6 * PAGE, 1, 0),  # a hole: nothing in the pages file
        entry(b + 7 * PAGE, 1, PE_PRESENT | PE_LAZY),
    )
    path, runs = lazy_runs(images, 7)
    assert path == tmp_path / "pages-3.img"
    assert runs == [
        Run(a + PAGE, b, 2 * PAGE),
        Run(b, b + 3 * PAGE, 5 * PAGE),
        Run(b + 7 * PAGE, b + 8 * PAGE, 8 * PAGE),
    ]


@pytest.mark.parametrize(
    "vmas, entries, error",
    [
        ([(0, 1 << 30)], [entry(PAGE, 1, PE_PRESENT | PE_PARENT)], "parent"),
        ([(0, 1 << 30)], [entry(PAGE + 1, 1, PE_PRESENT | PE_LAZY)], "bad entry"),
        ([(0, 1 << 30)], [entry(PAGE, 1 << 60, PE_PRESENT | PE_LAZY)], "bad entry"),
        ([(0, 1 << 30)], [entry(1 << 62, 1, PE_PRESENT | PE_LAZY)], "bad entry"),
        ([(0, PAGE)], [entry(0, 2, PE_PRESENT | PE_LAZY)], "no mapping"),
        ([(PAGE, 2 * PAGE)], [entry(0, 1, PE_PRESENT | PE_LAZY)], "no mapping"),
        (
            [(0, 1 << 30)],
            [entry(PAGE, 2, PE_PRESENT | PE_LAZY), entry(2 * PAGE, 1, PE_PRESENT | PE_LAZY)],
            "overlap",
        ),
    ],
)
def test_hostile_pagemaps_are_refused(
    tmp_path: Path, vmas: list[tuple[int, int]], entries: list[bytes], error: str
) -> None:
    with pytest.raises(ImageError, match=error):
        lazy_runs(images_of(tmp_path, vmas, *entries), 7)


@pytest.mark.parametrize(
    "pagemap",
    [
        MAGIC,  # no head
        MAGIC + struct.pack("<I", 100) + b"\x08\x01",  # an entry longer than the file
        MAGIC + b"\x01\x00",  # a length cut short
        MAGIC + struct.pack("<I", 2) + b"\x08\x01" + struct.pack("<I", 2) + b"\x0b\x01",  # group
        MAGIC + struct.pack("<I", 2) + b"\x08\x01" + struct.pack("<I", 3) + b"\x0a\x05\x01",
        MAGIC + struct.pack("<I", 1) + b"\x08\x01" + struct.pack("<I", 11) + b"\x08" + b"\xff" * 10,
    ],
)
def test_truncated_or_malformed_images_are_refused(tmp_path: Path, pagemap: bytes) -> None:
    (tmp_path / "pagemap-7.img").write_bytes(pagemap)
    image(tmp_path / "mm-7.img", mm((0, 1 << 30)))
    with pytest.raises(ImageError):
        lazy_runs(tmp_path, 7)


# Run in the sandbox before its snapshot: private anonymous regions of known contents.
REGIONS = """
import ctypes, hashlib, os, random
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                        ctypes.c_void_p]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
SIZE = 8 << 20
def mapped(prot=3):  # PROT_READ | PROT_WRITE; MAP_PRIVATE | MAP_ANONYMOUS
    return libc.mmap(None, SIZE, prot, 0x22, -1, 0)
def digest(address, size=SIZE):
    return hashlib.sha256(ctypes.string_at(address, size)).hexdigest()
names = ["forked", "dropped", "unmapped", "moved", "idle"]
regions = {name: mapped() for name in names}
for seed, name in enumerate(names):
    ctypes.memmove(regions[name], random.Random(seed).randbytes(SIZE), SIZE)
expected = {name: digest(address) for name, address in regions.items()}
half = digest(regions["unmapped"], SIZE // 2)
zeros = hashlib.sha256(bytes(SIZE)).hexdigest()
"""

# Run in the restored sandbox, its background copy parked: every region's pages are still
# to come but the few this touches first.
WHILE_PARKED = """
ctypes.string_at(regions["dropped"] + 4096, 1)  # one block in, the rest still to come
libc.madvise(regions["dropped"], SIZE, 4)  # MADV_DONTNEED: zeros from now on
libc.munmap(regions["unmapped"] + SIZE // 2, SIZE // 2)
ctypes.string_at(regions["moved"], 1)
target = mapped(prot=0)
regions["moved"] = libc.mremap(regions["moved"], SIZE, SIZE, 3, target)  # MAYMOVE | FIXED
asks, answers = os.pipe(), os.pipe()
child = os.fork()
if child == 0:
    try:
        os.write(answers[1], digest(regions["forked"]).encode())
        os.read(asks[0], 1)  # after the background copy
        os.write(answers[1], (digest(regions["forked"]) + digest(regions["idle"])).encode())
    finally:
        os._exit(0)
seen = {
    "child": os.read(answers[0], 64).decode(),
    "forked": digest(regions["forked"]),
    "dropped": digest(regions["dropped"]),
    "unmapped": digest(regions["unmapped"], SIZE // 2),
    "moved": digest(regions["moved"]),
}
"""

# Run once the background copy has put every page in place.
AFTER = """
os.write(asks[1], b"1")
later = os.read(answers[0], 128).decode()
os.waitpid(child, 0)
later = {
    "child": later[:64],
    "child idle": later[64:],
    "idle": digest(regions["idle"]),
    "dropped": digest(regions["dropped"]),
    "moved": digest(regions["moved"]),
}
"""

WANTED = """{
    "child": expected["forked"],
    "forked": expected["forked"],
    "dropped": zeros,
    "unmapped": half,
    "moved": expected["moved"],
}"""

WANTED_LATER = """{
    "child": expected["forked"],
    "child idle": expected["idle"],
    "idle": expected["idle"],
    "dropped": zeros,
    "moved": expected["moved"],
}"""


@pytest.mark.container
def test_memory_forked_remapped_dropped_and_unmapped_before_its_pages_came(
    container_engine: EngineProcess,
) -> None:
    box = Sandbox.create(backend="container", memory_mb=512, client=container_engine.client())
    try:
        box.create_code_context().run_code(REGIONS)
        snapshot_id = box.snapshot().id
    finally:
        box.kill()
    with container_engine.holding("lazy.background") as parked:
        copy = Sandbox.create(from_snapshot=snapshot_id, client=container_engine.client())
        try:
            parked()
            # Its lazy-pages server, forked from its shim, is not a sandbox of its own.
            assert container_engine.sandbox_pids() == [container_engine.sandbox_pid(copy.id)]
            ctx = copy.create_code_context()
            ctx.run_code(WHILE_PARKED)
            assert ctx.run_code(f"seen == {WANTED}").text == "True", ctx.run_code("seen").text
        except BaseException:
            copy.kill()
            raise
    try:
        log = container_engine.home / "sandboxes" / copy.id / WORK / "lazy.log"
        deadline = time.monotonic() + 300  # a bound for a hang, not a speed
        while "every page in place" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the background copy never ended"
            time.sleep(0.05)
        ctx.run_code(AFTER)
        assert ctx.run_code(f"later == {WANTED_LATER}").text == "True", ctx.run_code("later").text
    finally:
        copy.kill()


@pytest.mark.container
def test_a_capture_waits_for_the_pages_still_coming(container_engine: EngineProcess) -> None:
    """CRIU dumps the pages a process has in place, so a capture taken while the lazy-pages
    server still had pages to bring would restore them as zeros: it waits for them."""
    client = container_engine.client()
    box = Sandbox.create(backend="container", memory_mb=512, client=client)
    try:
        box.create_code_context().run_code(
            "import hashlib, os\ndata = os.urandom(64 << 20)\n"
            "digest = hashlib.sha256(data).hexdigest()"
        )
        snapshot_id = box.snapshot().id
    finally:
        box.kill()
    log = container_engine.home / "engine.log"
    with ThreadPoolExecutor(1) as pool:
        with container_engine.holding("lazy.background") as parked:
            copy = Sandbox.create(from_snapshot=snapshot_id, client=client)
            try:
                parked()
                taking = pool.submit(copy.snapshot, "while its pages came")
                deadline = time.monotonic() + 300  # a bound for a hang, not a speed
                while not taking.done() and PAGES_AWAITED not in log.read_text():
                    assert time.monotonic() < deadline, "the capture neither waited nor ended"
                    time.sleep(0.05)
            except BaseException:
                copy.kill()
                raise
        try:
            later = taking.result().id
        finally:
            copy.kill()
    again = Sandbox.create(from_snapshot=later, client=client)
    try:
        check = again.create_code_context().run_code("hashlib.sha256(data).hexdigest() == digest")
        assert check.text == "True", check
    finally:
        again.kill()
