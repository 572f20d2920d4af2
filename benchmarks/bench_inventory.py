"""The variable inventory of a large kernel state, timed in the guest.

Starts its own engine, fills a 3 GiB sandbox's kernel with a 1 GiB array and a million-row
frame, snapshots it ``--runs`` times and prints the inventory's own time (``elapsed_ms``,
measured in the guest) and whether it fit its budget, median and range. Under TCG on the
2-core machine it is about half a second; ``tests/test_inventory.py`` checks what the
inventory says of such a state, not how fast.

    .venv/bin/python benchmarks/bench_inventory.py --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import EngineProcess
from sandfork.sdk import Sandbox, Snapshot

STATE = (
    "import numpy as np, pandas as pd\n"
    "big = np.ones(2**27)\n"  # 1 GiB
    "frame = pd.DataFrame({'a': np.arange(1_000_000), 'b': np.ones(1_000_000)})"
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    engine = EngineProcess(scratch("sfinventory-"))
    engine.start()
    elapsed, truncated = [], 0
    try:
        client = engine.client()
        sandbox = Sandbox.create(client=client, memory_mb=3072)
        try:
            made = sandbox.create_code_context().run_code(STATE, timeout_seconds=600)
            assert made.error is None, made.error
            for _ in range(args.runs):
                snapshot_id = sandbox.snapshot().id
                inventory = Snapshot.get(snapshot_id, client=client).inventory()
                assert inventory.status == "ok", inventory
                elapsed.append(inventory.elapsed_ms)
                truncated += inventory.truncated
                client.request("DELETE", f"/snapshots/{snapshot_id}")
        finally:
            sandbox.kill()
    finally:
        engine.close()
    print(
        f"inventory of a 1 GiB array and a 1M-row frame, {args.runs} runs: median "
        f"{statistics.median(elapsed):.0f} ms (range {min(elapsed)}-{max(elapsed)} ms), "
        f"{truncated} truncated by the budget"
    )


if __name__ == "__main__":
    main()
