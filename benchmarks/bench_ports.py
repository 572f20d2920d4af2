"""A server inside a sandbox reached through the engine's port proxy, against the same requests
made inside the sandbox to its own loopback (the peer: no proxy, no channel).

Starts an engine (state in a temporary folder; templates and CRIU from the shared cache) on
the backend asked for, a ``python -m http.server`` in one sandbox serving a small file and a
large one, and measures, medians over ``--runs``: the latency of one small GET (a new
connection each, as a browser's first request), and the throughput of one large download.
Writes ``docs/benchmarks/ports-{backend}.{json,md}``.

    .venv/bin/python benchmarks/bench_ports.py --backend container --runs 20 --mib 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import requests
from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import clock

from conftest import EngineProcess
from sandfork.sdk import Sandbox

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
PORT = 8000

# Runs in the guest: the same requests to the server on its own loopback.
INSIDE = r"""
import json, sys, time, urllib.request
runs, url = int(sys.argv[1]), sys.argv[2]
small, big = [], []
for _ in range(runs):
    start = time.perf_counter()
    urllib.request.urlopen(url + "small.txt").read()
    small.append(time.perf_counter() - start)
for _ in range(3):
    start = time.perf_counter()
    with urllib.request.urlopen(url + "big.bin") as r:
        while r.read(1 << 16):
            pass
    big.append(time.perf_counter() - start)
print(json.dumps({"small": small, "big": big}))
"""


def _serving(sandbox: Sandbox, mib: int) -> None:
    sandbox.exec(
        f"mkdir -p /tmp/site && echo hi > /tmp/site/small.txt && "
        f"head -c {mib}M /dev/urandom > /tmp/site/big.bin && cd /tmp/site && "
        f"nohup python3 -m http.server {PORT} >/dev/null 2>&1 &",
        check=True,
    )
    while PORT not in sandbox.ports():
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("container", "vm"), default="container")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    os.environ["SANDFORK_TEST_BACKEND"] = args.backend
    engine = EngineProcess(scratch("bench-ports-"))
    engine.start()
    try:
        sandbox = Sandbox.create(client=engine.client())
        try:
            _serving(sandbox, args.mib)
            url = sandbox.preview_url(PORT)
            small = [
                clock(lambda: requests.get(url + "small.txt", headers=engine.auth).content)[0]
                for _ in range(args.runs)
            ]
            big = []
            for _ in range(3):
                seconds, size = clock(
                    lambda: len(requests.get(url + "big.bin", headers=engine.auth).content)
                )
                assert size == args.mib * 2**20, size
                big.append(seconds)
            sandbox.filesystem.write("/tmp/inside.py", INSIDE)
            inside = json.loads(
                sandbox.exec(
                    f"python3 /tmp/inside.py {args.runs} http://127.0.0.1:{PORT}/", check=True
                ).stdout
            )
        finally:
            sandbox.kill()
    finally:
        engine.close()
    report = {
        "backend": args.backend,
        "runs": args.runs,
        "mib": args.mib,
        "small_ms": {
            "proxy": statistics.median(small) * 1000,
            "inside": statistics.median(inside["small"]) * 1000,
        },
        "big_mib_s": {
            "proxy": args.mib / statistics.median(big),
            "inside": args.mib / statistics.median(inside["big"]),
        },
    }
    lines = [
        f"# Port proxy ({args.backend}; medians: {args.runs} small GETs, 3 downloads of "
        f"{args.mib} MiB)",
        "",
        "| | through the engine | inside the sandbox (peer) | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, unit, key in (("small GET", "ms", "small_ms"), ("download", "MiB/s", "big_mib_s")):
        proxy, peer = report[key]["proxy"], report[key]["inside"]
        lines.append(f"| {name} | {proxy:.1f} {unit} | {peer:.1f} {unit} | {proxy / peer:.2f}x |")
    print("\n".join(lines))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"ports-{args.backend}.json").write_text(json.dumps(report, indent=2) + "\n")
    (OUT / f"ports-{args.backend}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
