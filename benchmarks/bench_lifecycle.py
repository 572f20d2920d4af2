"""Sandbox life-cycle latency: cold create to first result, exec and run_code round trips.

Starts its own engine (state in a temporary directory, template from the shared cache) and
prints medians over ``--runs`` runs. Peers measured in the same run, on the same machine:
a local ``subprocess.run`` of the same command (what exec costs without a VM) and a local
ipykernel reached directly with jupyter_client (what run_code costs without a VM).

    .venv/bin/python benchmarks/bench_lifecycle.py --runs 10
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from jupyter_client.manager import start_new_kernel
from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import ms, ratio, timed

from conftest import EngineProcess
from sandfork.sdk import Sandbox


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="creates to time (>= 10)")
    parser.add_argument("--cold-runs", type=int, default=3, help="creates that boot cold")
    parser.add_argument(
        "--round-trips", type=int, default=200, help="exec / run_code round trips to time"
    )
    args = parser.parse_args()

    cold_boot = []
    cold = EngineProcess(scratch("sandfork-bench-cold-"), "--no-boot-captures")
    cold.start()
    try:
        for _ in range(args.cold_runs):
            start = time.perf_counter()
            sb = Sandbox.create(client=cold.client())
            sb.exec("true")
            cold_boot.append(time.perf_counter() - start)
            sb.kill()
    finally:
        cold.close()

    engine = EngineProcess(scratch("sandfork-bench-"))
    engine.start()
    client = engine.client()
    try:
        Sandbox.create(client=client).kill()  # the template's boot capture exists from here on
        create, first_code = [], []
        for _ in range(args.runs):
            start = time.perf_counter()
            sb = Sandbox.create(client=client)
            sb.exec("true")
            create.append(time.perf_counter() - start)
            start = time.perf_counter()
            sb.create_code_context().run_code("1")
            first_code.append(time.perf_counter() - start)
            sb.kill()

        sb = Sandbox.create(client=client)
        ctx = sb.create_code_context()
        ctx.run_code("1")
        sb.exec("true")
        exec_rt = timed(lambda: sb.exec("true"), args.round_trips)
        code_rt = timed(lambda: ctx.run_code("1"), args.round_trips)
        sb.kill()
    finally:
        engine.close()

    local_exec = timed(
        lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True), args.round_trips
    )
    km, kc = start_new_kernel()
    try:
        local_code = timed(
            lambda: kc.execute_interactive("1", output_hook=lambda m: None), args.round_trips
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    print(f"accelerator: {sb.accelerator}")
    print(f"create to first exec result      : {ms(create)}   target <= 5000 ms")
    print(f"  (cold boot, no template capture): {ms(cold_boot)}")
    print(f"then first run_code              : {ms(first_code)}")
    print(f"exec round trip ('true')         : {ms(exec_rt)}   target <= 20 ms")
    print(f"  peer: local subprocess.run     : {ms(local_exec)}   {ratio(exec_rt, local_exec)}")
    print(f"run_code round trip ('1')        : {ms(code_rt)}   target <= 20 ms")
    print(f"  peer: local ipykernel direct   : {ms(local_code)}   {ratio(code_rt, local_code)}")


if __name__ == "__main__":
    main()
