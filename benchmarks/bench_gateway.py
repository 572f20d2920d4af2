"""The gateway's overhead on an exec round trip (issue 24: at most 2 ms per exec).

Starts a gateway and one engine registered with it (state in temporary folders), creates one
sandbox, and times ``exec("true")`` with the Python SDK through the gateway and directly
against the engine, taking turns so that both see the same machine; the same for a
``run_code`` of ``1``. Prints the medians and their difference, and writes
``docs/benchmarks/gateway.md``.

    .venv/bin/python benchmarks/bench_gateway.py --runs 200 --backend container
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import clock

from gateway_helpers import GatewayProcess, start_engines
from sandfork.sdk import Client, Sandbox

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "gateway.md"


def _turns(
    direct: Callable[[], object], gateway: Callable[[], object], runs: int
) -> tuple[list[float], list[float]]:
    """Durations of ``runs`` calls of each, taking turns (after a few warm-up calls)."""
    for _ in range(5):
        direct(), gateway()
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(runs):
        theirs.append(clock(direct)[0])
        ours.append(clock(gateway)[0])
    return theirs, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--backend", choices=("container", "vm"), default="container")
    args = parser.parse_args()
    root = scratch("sandfork-bench-gateway-")
    gateway = GatewayProcess(root / "gateway", ["bench"])
    (root / "gateway").mkdir()
    gateway.start()
    backend = f"--EngineConfig.backend={args.backend}"  # the sandboxes' backend
    (engine,) = start_engines(gateway, {"bench": root / "engine"}, backend).values()
    rows = []
    try:
        sandbox = Sandbox.create(client=engine.client())
        try:
            via = Sandbox.get(sandbox.id, client=Client(gateway.url, gateway.api_key))
            direct_ctx = sandbox.create_code_context()
            via_ctx = via.create_code_context()
            calls = {
                "GET the sandbox": (sandbox.refresh, via.refresh),
                'exec("true")': (lambda: sandbox.exec("true"), lambda: via.exec("true")),
                'run_code("1")': (lambda: direct_ctx.run_code("1"), lambda: via_ctx.run_code("1")),
            }
            for name, (direct, through) in calls.items():
                theirs, ours = _turns(direct, through, args.runs)
                d, g = statistics.median(theirs) * 1000, statistics.median(ours) * 1000
                paired = statistics.median(o - t for o, t in zip(ours, theirs, strict=True))
                rows.append((name, d, g, paired * 1000))
                print(
                    f"{name:16} engine {d:8.2f} ms  gateway {g:8.2f} ms  overhead "
                    f"{g - d:+.2f} ms (median of paired differences {paired * 1000:+.2f} ms)"
                )
        finally:
            sandbox.kill()
    finally:
        engine.close()
        gateway.stop()
    load = os.getloadavg()[0]
    lines = [
        f"# Gateway overhead ({args.backend}; medians of {args.runs} calls each, taking turns)",
        "",
        "| call | engine directly | through the gateway | overhead | paired |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(
            f"| {n} | {d:.2f} ms | {g:.2f} ms | {g - d:+.2f} ms | {p:+.2f} ms |"
            for n, d, g, p in rows
        ),
        "",
        "*overhead*: the difference of the medians; *paired*: the median of the differences of",
        "calls made one after the other.",
        "",
        f"`.venv/bin/python benchmarks/bench_gateway.py --runs {args.runs} "
        f"--backend {args.backend}`; target: at most 2 ms of overhead per exec. Load average "
        f"while it ran: {load:.1f} on {os.cpu_count()} cores.",
        "",
    ]
    OUT.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
