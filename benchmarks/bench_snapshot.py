"""Snapshot, restore and fork of a kernel holding about 100 MB and about 1 GiB.

Starts its own engine (state in a temporary directory, template and its boot capture from the
shared cache) and prints, per size, the median over ``--runs`` runs of: snapshot time, how
long the sandbox was paused, bytes stored, restore to first result, fork (to the child's
first result), fork_tree(8), and a second snapshot of the unchanged sandbox (bytes it adds).

Peers, same run and same data: CRIU 4 dump/restore of a local Python process holding the same
array (``benchmarks/peers/criu.sh`` fetches it) and Kishu's commit/checkout of a local kernel
holding it (installed from PyPI into its own virtualenv under the cache).

    .venv/bin/python benchmarks/bench_snapshot.py --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import criu_peer, kishu_peer
from timing import clock

from conftest import EngineProcess
from sandfork.sdk import Client, Sandbox, Snapshot

SIZES = {"100 MB": (100 * 2**20, 1024), "1 GiB": (2**30, 2560)}
FILL = "import numpy as np\nheld = np.full({n}, 7, dtype=np.uint8)\nint(held[-1])"


def measure(client: Client, size: int, memory_mb: int, runs: int) -> dict[str, float]:
    sb = Sandbox.create(memory_mb=memory_mb, client=client)
    ctx = sb.create_code_context()
    assert ctx.run_code(FILL.format(n=size)).text == "7"
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    made: list[Sandbox] = []
    for _ in range(runs):
        seconds, snap_id = clock(sb.snapshot)
        snap = Snapshot.get(snap_id, client=client)
        add("snapshot (s)", seconds)
        add("parent paused (s)", snap.paused_ms / 1000)
        add("bytes stored (MB)", snap.size_bytes / 1e6)
        seconds, again = clock(sb.snapshot)
        add(
            "2nd snapshot, unchanged: bytes added (MB)",
            Snapshot.get(again, client=client).size_bytes / 1e6,
        )

        def restore(snap_id: str = snap_id) -> Sandbox:
            restored = Sandbox.create(from_snapshot=snap_id, client=client)
            assert restored.create_code_context().run_code("int(held[0])").text == "7"
            return restored

        seconds, restored = clock(restore)
        add("restore to first result (s)", seconds)
        made.append(restored)

        def fork() -> Sandbox:
            child = sb.fork()
            assert child.create_code_context().run_code("int(held[1])").text == "7"
            return child

        seconds, child = clock(fork)
        add("fork to first result (s)", seconds)
        made.append(child)
        for s in made:
            s.kill()
        made.clear()
        seconds, children = clock(lambda: sb.fork_tree(8))
        add("fork_tree(8) (s)", seconds)
        for s in children:
            s.kill()
        for s in (snap_id, again):
            Snapshot.get(s, client=client).delete()
    sb.kill()
    return {name: statistics.median(values) for name, values in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    args = parser.parse_args()

    engine = EngineProcess(Path(tempfile.mkdtemp(prefix="sandfork-bench-")))
    engine.start()
    results: dict[str, dict[str, float]] = {}
    try:
        client = engine.client()
        Sandbox.create(client=client).kill()  # make sure the boot capture exists
        for label in args.sizes:
            size, memory_mb = SIZES[label]
            results[label] = measure(client, size, memory_mb, args.runs)
            results[label].update(criu_peer(size, args.runs))
            results[label].update(kishu_peer(size, args.runs))
            results[label].update(kishu_peer(size, args.runs))
    finally:
        engine.close()

    names = list(dict.fromkeys(n for r in results.values() for n in r))
    print(f"{'median of ' + str(args.runs) + ' runs':48}" + "".join(f"{s:>14}" for s in results))
    for name in names:
        cells = "".join(f"{results[s].get(name, float('nan')):14.3f}" for s in results)
        print(f"{name:48}{cells}")
    for label, row in results.items():
        if "CRIU dump (s)" in row:
            dump = row["snapshot (s)"] / row["CRIU dump (s)"]
            restore = row["restore to first result (s)"] / row["CRIU restore (s)"]
            print(f"{label}: snapshot/CRIU dump {dump:.1f}x, restore {restore:.1f}x")
        if "Kishu commit (s)" in row:
            commit = row["snapshot (s)"] / row["Kishu commit (s)"]
            checkout = row["restore to first result (s)"] / row["Kishu checkout (s)"]
            print(f"{label}: snapshot/Kishu commit {commit:.1f}x, checkout {checkout:.1f}x")


if __name__ == "__main__":
    main()
