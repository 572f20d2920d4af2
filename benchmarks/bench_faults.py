"""Fault injection: the engine SIGKILLed at random instants of its operations, again and again.

Each round starts one operation (create, restore, snapshot, a cell's checkpoint as the proxy
kernel takes it, hibernate, wake, fork, promote, export, import or delete) in a thread, waits
for proof that it is in flight (a new VM directory, a snapshot's staging folder, a file in the
engine's ``tmp`` folder, a VM gone from under a listed sandbox), waits a random extra 0-300 ms,
and SIGKILLs the engine. A fresh engine then starts on the same
state and ``tests/engine_invariants.check_engine`` checks that every listed snapshot restores
with its data, every running sandbox snapshots, and nothing is left unowned. Operations that
finish before any proof shows up are retried, not counted as kills.

    .venv/bin/python benchmarks/bench_faults.py --kills 44
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import EngineProcess
from engine_invariants import cell_checkpoint, check_engine, make_state
from sandfork.sdk import Sandbox, Snapshot


def _entries(path: Path, pattern: str = "*") -> set[str]:
    return {p.name for p in path.glob(pattern)} if path.exists() else set()


def _killed(pid: int) -> bool:
    """True once the process got its SIGKILL (a zombie not yet reaped, or gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


class Round:
    """One operation on the engine and the evidence that it is under way."""

    def __init__(self, engine: EngineProcess, sandbox: Sandbox, snapshot_id: str) -> None:
        self.engine, self.sandbox, self.snapshot_id = engine, sandbox, snapshot_id
        self.export_file = engine.home.parent / f"{engine.home.name}-export.sfsnap"

    def operation(self, name: str) -> tuple[Callable[[], object], Callable[[], bool]]:
        """The call named ``name`` and a test that it is in flight, armed now (after what
        the call needs first: a hibernated sandbox to wake, a fork child to promote)."""
        home, client, sandbox = self.engine.home, self.engine.client(), self.sandbox
        if name == "wake":
            sandbox.hibernate()
        child = sandbox.fork() if name == "promote" else None
        vms = _entries(home / "sandboxes")
        tmp = _entries(home / "tmp")
        new_vm = lambda: bool(_entries(home / "sandboxes") - vms)  # noqa: E731
        new_tmp = lambda: bool(_entries(home / "tmp") - tmp)  # noqa: E731
        staging = lambda: bool(_entries(home / "snapshots", ".tmp-*"))  # noqa: E731
        pid = None if name == "wake" else self.engine.sandbox_pid(sandbox.id)
        snapshot = Snapshot.get(self.snapshot_id, client=client)
        if name in ("export", "import") and not self.export_file.exists():
            snapshot.export(self.export_file)
        operations: dict[str, tuple[Callable[[], object], Callable[[], bool]]] = {
            "create": (lambda: Sandbox.create(client=client), new_vm),
            "restore": (
                lambda: Sandbox.create(from_snapshot=self.snapshot_id, client=client),
                new_vm,
            ),
            "snapshot": (lambda: sandbox.snapshot(), staging),
            "checkpoint": (lambda: cell_checkpoint(sandbox, self.snapshot_id), staging),
            "hibernate": (lambda: sandbox.hibernate(), staging),
            "wake": (lambda: sandbox.wake(), new_vm),
            "fork": (lambda: sandbox.fork(), lambda: new_vm() or staging()),
            "promote": (
                lambda: child.promote() if child else None,
                lambda: pid is not None and _killed(pid),
            ),
            "export": (lambda: snapshot.export(self.export_file.with_suffix(".again")), new_tmp),
            "import": (lambda: Snapshot.import_file(self.export_file, client=client), new_tmp),
            "delete": (lambda: sandbox.kill(), lambda: pid is not None and _killed(pid)),
        }
        return operations[name]


OPERATIONS = (
    "create",
    "restore",
    "snapshot",
    "checkpoint",
    "hibernate",
    "wake",
    "fork",
    "promote",
    "export",
    "import",
    "delete",
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=44, help="engine kills to inject (>= 30)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    engine = EngineProcess(scratch("sandfork-faults-"))
    engine.start()
    kills: Counter[str] = Counter()
    finished_first: Counter[str] = Counter()
    digests: dict[str, str] = {}
    started = time.monotonic()
    try:
        while sum(kills.values()) < args.kills:
            client = engine.client()
            running = [s for s in Sandbox.list(client=client) if s.status == "running"]
            sandbox = running[0] if running else Sandbox.create(client=client)
            seed = rng.randrange(1 << 30)
            digest = make_state(sandbox, seed)
            snapshot_id = sandbox.snapshot(f"seed-{seed}").id
            digests[snapshot_id] = digest
            name = rng.choice(OPERATIONS)
            call, in_flight = Round(engine, sandbox, snapshot_id).operation(name)
            done = threading.Event()

            def run(call: Callable[[], object] = call, done: threading.Event = done) -> None:
                try:
                    call()
                except Exception:  # the engine died under it: expected
                    pass
                done.set()

            threading.Thread(target=run, daemon=True).start()
            while not in_flight() and not done.is_set():
                time.sleep(0.0005)
            if done.is_set() and not in_flight():
                finished_first[name] += 1
            else:
                quick = name in ("delete", "promote")  # killing a VM takes ms
                time.sleep(0 if quick else rng.uniform(0, 0.3))
                engine.stop(signal.SIGKILL)
                kills[name] += 1
                done.wait(60)
                engine.start()
                check_engine(engine, digests)
            elapsed = time.monotonic() - started
            print(f"[{elapsed:6.0f} s] {name:8} kills {sum(kills.values()):3}: {dict(kills)}")
            for snap in engine.client().request("GET", "/snapshots")["snapshots"]:
                if len(digests) > 3 and snap["id"] in digests and snap["id"] != snapshot_id:
                    engine.client().request("DELETE", f"/snapshots/{snap['id']}")
                    digests.pop(snap["id"])
    finally:
        for sandbox in Sandbox.list(client=engine.client()):
            sandbox.kill()
        engine.close()
    print(
        f"\n{sum(kills.values())} engine kills injected ({dict(kills)}), every restart checked: "
        f"all snapshots restored with their data, all running sandboxes snapshotted, nothing "
        f"unowned. Operations that finished before a kill could land: {dict(finished_first)}. "
        f"{time.monotonic() - started:.0f} s in all."
    )


if __name__ == "__main__":
    main()
