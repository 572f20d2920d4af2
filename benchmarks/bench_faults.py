"""Fault injection: the engine SIGKILLed at random instants of its operations, again and again.

Each round starts one operation (create, snapshot, restore, fork, export, import or delete)
in a thread, waits for proof that it is in flight (a new VM directory, a snapshot's staging
folder, a file in the engine's ``tmp`` folder, a VM gone from under a listed sandbox), waits
a random extra 0-300 ms, and SIGKILLs the engine. A fresh engine then starts on the same
state and ``tests/engine_invariants.check_engine`` checks that every listed snapshot restores
with its data, every running sandbox snapshots, and nothing is left unowned. Operations that
finish before any proof shows up are retried, not counted as kills.

    .venv/bin/python benchmarks/bench_faults.py --kills 35
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import EngineProcess
from engine_invariants import check_engine, make_state
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

    def operations(self) -> dict[str, tuple[Callable[[], object], Callable[[], bool]]]:
        """Name -> (the call, a test that it is in flight), each test armed now."""
        home, client = self.engine.home, self.engine.client()
        vms = _entries(home / "sandboxes")
        tmp = _entries(home / "tmp")
        new_vm = lambda: bool(_entries(home / "sandboxes") - vms)  # noqa: E731
        new_tmp = lambda: bool(_entries(home / "tmp") - tmp)  # noqa: E731
        staging = lambda: bool(_entries(home / "snapshots", ".tmp-*"))  # noqa: E731
        victim = self.sandbox.id
        pid = self.engine.qemu_pid(victim)
        snapshot = Snapshot.get(self.snapshot_id, client=client)
        if not self.export_file.exists():
            snapshot.export(self.export_file)
        return {
            "create": (lambda: Sandbox.create(client=client), new_vm),
            "restore": (
                lambda: Sandbox.create(from_snapshot=self.snapshot_id, client=client),
                new_vm,
            ),
            "snapshot": (lambda: self.sandbox.snapshot(), staging),
            "fork": (lambda: self.sandbox.fork(), lambda: new_vm() or staging()),
            "export": (lambda: snapshot.export(self.export_file.with_suffix(".again")), new_tmp),
            "import": (lambda: Snapshot.import_file(self.export_file, client=client), new_tmp),
            "delete": (lambda: self.sandbox.kill(), lambda: _killed(pid)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=35, help="engine kills to inject (>= 30)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    engine = EngineProcess(Path(tempfile.mkdtemp(prefix="sandfork-faults-")))
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
            snapshot_id = sandbox.snapshot(f"seed-{seed}")
            digests[snapshot_id] = digest
            name = rng.choice(
                ["create", "restore", "snapshot", "fork", "export", "import", "delete"]
            )
            call, in_flight = Round(engine, sandbox, snapshot_id).operations()[name]
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
                time.sleep(0 if name == "delete" else rng.uniform(0, 0.3))  # delete takes ms
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
