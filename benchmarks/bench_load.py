"""Load: concurrent clients looping create → run_code → snapshot → restore → fork → kill.

Starts its own engine and runs ``--clients`` workers for ``--rounds`` rounds of one cycle
each (``tests/engine_load.py``); a reader times ``GET /v1/sandboxes`` every 100 ms. Prints
the operations, failures, list latency (median, p99, at the client and in the engine), the
engine's RSS after each round and the counts that grew after the warm-up round (what
``tests/test_load.py`` checks); ``--counts`` prints every count that moved, round by round.
Speed is measured here and nowhere in the tests.

    .venv/bin/python benchmarks/bench_load.py --clients 4 --rounds 12
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import EngineProcess
from engine_load import run_load


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--counts", action="store_true", help="print every count that moved")
    args = parser.parse_args()
    engine = EngineProcess(scratch("sfload-"))
    engine.start()
    try:
        report = run_load(engine, args.clients, args.rounds)
    finally:
        engine.close()
    print(report.summary())
    if args.counts:
        for key in sorted(report.growth()):
            values = [counts.get(key, 0) for counts in report.counts]
            if len(set(values)) > 1:
                print(f"  {key}: {values}")
    leaks = report.leaks()
    print(f"leaks: {leaks or 'none'}")
    for failure in report.failures:
        print(failure)
    sys.exit(1 if report.failures or leaks else 0)


if __name__ == "__main__":
    main()
