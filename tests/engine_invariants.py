"""What must hold of an engine's state after any crash: nothing lost, nothing unowned.

Used by the crash tests and by ``benchmarks/bench_faults.py`` (the long random-kill run).
"""

from __future__ import annotations

import asyncio
import sqlite3

from conftest import EngineProcess
from sandfork.proxy_kernel.checkpoints import CellCheckpoints
from sandfork.sdk import Sandbox, Snapshot

STATE_CODE = (
    "import hashlib, numpy as np\n"
    "state = np.random.default_rng({seed}).integers(0, 2**31, 2_000_000)\n"
    "open('/root/state.bin', 'wb').write(state.tobytes())\n"
    "hashlib.sha256(state.tobytes()).hexdigest()"
)
CHECK_CODE = (
    "import hashlib\n"
    "(hashlib.sha256(state.tobytes()).hexdigest(), "
    "hashlib.sha256(open('/root/state.bin', 'rb').read()).hexdigest())"
)


def make_state(sandbox: Sandbox, seed: int) -> str:
    """Fill a sandbox's kernel and disk with 16 MB of known data; return its SHA-256."""
    result = sandbox.create_code_context().run_code(STATE_CODE.format(seed=seed))
    assert result.error is None, result.error
    return result.text.strip("'")


def cell_checkpoint(sandbox: Sandbox, previous: str) -> Snapshot:
    """The proxy kernel's checkpoint after a cell (on top of checkpoint ``previous``), taken
    as its kernel takes it."""
    checkpoints = CellCheckpoints(enabled=True, head=previous)
    checkpoints.started("msg-1", "x = 1", {"cellId": "cell-1"})
    metadata = checkpoints.finished("msg-1", b'{"execution_count": 1}')
    assert metadata is not None
    return asyncio.run(checkpoints.take(sandbox, metadata))


def state_digests(sandbox: Sandbox) -> tuple[str, str]:
    """The SHA-256 of the data in the sandbox's kernel memory and on its disk."""
    result = sandbox.create_code_context().run_code(CHECK_CODE)
    assert result.error is None, result.error
    memory, disk = eval(result.text)  # a tuple of two hex strings, from our own code
    return memory, disk


def _db(engine: EngineProcess) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{engine.home / 'engine.sqlite'}?mode=ro", uri=True)


def owned_layers(engine: EngineProcess) -> tuple[set[str], set[str]]:
    """The layer files on disk (disk and memory), and the layers some sandbox or snapshot
    has in one of its chains."""
    with _db(engine) as db:
        layers = dict(db.execute("SELECT path, backing FROM layers").fetchall())
        roots = []
        for table in ("sandboxes", "snapshots"):
            for disk, memory in db.execute(f"SELECT disk, memory FROM {table}"):
                roots += [disk, memory]
    reachable = set()
    for path in roots:
        while path in layers and path not in reachable:
            reachable.add(path)
            path = layers[path]
    on_disk = {str(p) for p in (engine.home / "layers").glob("[!.]*")}
    return on_disk, reachable


def check_engine(engine: EngineProcess, digests: dict[str, str]) -> None:
    """Every listed snapshot restores and answers, with the data it was taken with where
    ``digests`` knows it (snapshot ids to the SHA-256 of :func:`make_state`); every running
    sandbox snapshots, every hibernated one wakes (and runs on); and no QEMU process, layer,
    RAM file or temporary file is left that nothing owns."""
    client = engine.client()
    client.request("GET", "/engine/stats")  # answered once background deletions are done
    sandboxes = client.request("GET", "/sandboxes")["items"]
    running = {s["id"] for s in sandboxes if s["status"] == "running"}
    hibernated = [s["id"] for s in sandboxes if s["status"] == "hibernated"]
    assert {s["status"] for s in sandboxes} <= {"running", "hibernated", "dead"}, sandboxes

    pids = engine.sandbox_pids()
    assert len(pids) == len(running), f"sandbox processes {pids} for sandboxes {running}"
    ram_files = {p.name for p in engine.ram_dir.glob("*.ram")}  # booted VMs' zeroed RAM
    assert ram_files <= {f"{i}.ram" for i in running}, ram_files
    leftovers = [p for p in (engine.ram_dir / "staging").glob("*")]
    leftovers += list((engine.home / "snapshots").glob(".*"))
    leftovers += [p for p in (engine.home / "tmp").glob("*")]
    assert leftovers == [], f"temporary files left: {leftovers}"
    on_disk, reachable = owned_layers(engine)
    assert on_disk == reachable, f"unowned layers {on_disk - reachable}, lost {reachable - on_disk}"

    for snap in client.request("GET", "/snapshots")["snapshots"]:
        restored = Sandbox.create(from_snapshot=snap["id"], client=client)
        try:
            if snap["id"] in digests:
                expected = digests[snap["id"]]
                assert state_digests(restored) == (expected, expected), snap["id"]
            else:  # what it held is not known here: it restores, and its kernel answers
                answer = restored.create_code_context().run_code("6 * 7")
                assert answer.error is None and answer.text == "42", (snap["id"], answer)
        finally:
            restored.kill()
    for sandbox_id in running:
        sandbox = Sandbox.get(sandbox_id, client=client)
        snapshot_id = sandbox.snapshot().id
        client.request("DELETE", f"/snapshots/{snapshot_id}")
    for sandbox_id in hibernated:  # asleep, not lost: it wakes with its kernel
        sleeper = Sandbox.get(sandbox_id, client=client)
        sleeper.wake()
        answer = sleeper.create_code_context().run_code("6 * 7")
        assert answer.error is None and answer.text == "42", (sandbox_id, answer)
