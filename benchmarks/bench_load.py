"""Load: concurrent clients looping create → run_code → snapshot → restore → fork → kill.

Starts its own engine and runs ``--clients`` workers for ``--minutes``; a reader times
``GET /v1/sandboxes`` every 100 ms and samples the engine's memory. Prints the operations,
failures, list latency (median, p99) and the engine's memory growth after warm-up.

    .venv/bin/python benchmarks/bench_load.py --clients 4 --minutes 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import EngineProcess
from engine_load import run_load


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=10)
    args = parser.parse_args()
    engine = EngineProcess(Path(tempfile.mkdtemp(prefix="sfload-")))
    engine.start()
    try:
        report = run_load(engine, args.clients, args.minutes * 60)
    finally:
        engine.close()
    print(report.summary())
    for failure in report.failures:
        print(failure)
    sys.exit(1 if report.failures else 0)


if __name__ == "__main__":
    main()
