"""The snapshot store (issue 24): upload throughput, bytes stored for per-cell checkpoints
against their sum (the dedup ratio), and a restore on an engine that must fetch the snapshot
against one on the engine that has it, lazily and whole.

Starts SeaweedFS (``tests/s3_server.py``) and three engines sharing one bucket (container
backend, state in temporary folders; C with ``--EngineConfig.lazy_fetch=False``), runs
``--cells`` cells in one sandbox on engine A, each adding ``--cell-kib`` of fresh data to a
list and followed by a checkpoint, waits until every checkpoint is durable, then restores the
last one on A (local) and on B (fetched), each timed to its first result. Then, for each of
``--sizes`` (MiB of distinct pages a kernel holds), ``--runs`` snapshots of a sandbox holding
that much (its pages changed between them), each restored to its first result on A, which
has it, on B, which fetches it lazily (the restore starts once all but the memory pages are
here), and on C, which fetches it whole before the start (B and C have none of its memory's
chunks; each has the template from a first restore, not timed). Prints the figures and
writes ``docs/benchmarks/store.md``.

    .venv/bin/python benchmarks/bench_store.py --cells 20 --sizes 100 1024 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers.held import HELD

from conftest import EngineProcess
from s3_server import BUCKET, SeaweedS3, new_prefix
from sandfork.sdk import Sandbox

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "store.md"
DURABLE = re.compile(
    r"snapshot (\S+) is durable: (\d+) chunks sent \(([\d.]+) MiB, ([\d.]+) MiB/s\), "
    r"(\d+) already stored; ([\d.]+) MiB stored in ([\d.]+) s"
)


def engine(home: Path, s3: SeaweedS3, prefix: str, *more: str) -> EngineProcess:
    home.mkdir()
    proc = EngineProcess(
        home,
        *more,
        "--EngineConfig.backend=container",
        "--EngineConfig.snapshot_store=s3",
        f"--S3Store.endpoint_url={s3.endpoint_url}",
        f"--S3Store.bucket={BUCKET}",
        f"--S3Store.prefix={prefix}",
    )
    proc.env = s3.env
    proc.start()
    return proc


def template_bytes(client: Any, prefix: str) -> int:
    """The size of the template builds in the bucket (their manifests' files)."""
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}manifests/template-")
    total = 0
    for item in listed.get("Contents", []):
        body = client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
        manifest = json.loads(body.partition(b"\n")[2])  # after its signature's line
        total += sum(int(e.get("size", 0)) for e in manifest["entries"])
    return total


def wait_durable(proc: EngineProcess, snapshot_id: str) -> None:
    while proc.client().request("GET", f"/snapshots/{snapshot_id}")["storage"] != "durable":
        time.sleep(0.1)


def first_result(proc: EngineProcess, snapshot_id: str, code: str = "len(cells)") -> float:
    """Seconds from the restore request to the restored kernel's first result."""
    started = time.monotonic()
    box = Sandbox.create(from_snapshot=snapshot_id, client=proc.client())
    try:
        assert box.create_code_context().run_code(code).text
        return time.monotonic() - started
    finally:
        box.kill()


def cached_and_fetched(
    a: EngineProcess, others: list[EngineProcess], mib: int, runs: int
) -> list[list[float]]:
    """Restores to first result of ``runs`` snapshots of a sandbox holding ``mib`` MiB: on
    ``a``, which took them, then on each of ``others``, which fetch each first."""
    box = Sandbox.create(backend="container", memory_mb=mib + 768, client=a.client())
    ids = []
    try:
        ctx = box.create_code_context()
        ctx.run_code(f"import numpy as np\nheld = {HELD.format(n=mib * 2**20)}")
        for run in range(runs):
            ctx.run_code(f"held ^= np.uint8({run + 1})")  # pages no earlier snapshot had
            ids.append(box.snapshot().id)
    finally:
        box.kill()
    for snapshot_id in ids:  # no restore is timed against another snapshot's upload
        wait_durable(a, snapshot_id)
    times: list[list[float]] = [[] for _ in range(1 + len(others))]
    for snapshot_id in ids:
        for engine, row in zip([a, *others], times, strict=True):
            row.append(first_result(engine, snapshot_id, "held.size"))
            settled(engine)
    return times


def settled(proc: EngineProcess) -> None:
    """Wait until the engine's lazy fills have ended and what it wrote is on disk: each
    restore is timed on its own, not against the writeback of the fetch before it."""
    lazy = proc.home / "lazy"
    while lazy.exists() and any(lazy.glob("*.filling")):
        time.sleep(0.1)
    os.sync()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--cell-kib", type=int, default=256)
    parser.add_argument("--sizes", type=int, nargs="*", default=[100, 1024], help="MiB held")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = scratch("sf-store-")
    s3 = SeaweedS3(root / "s3")
    s3.start()
    prefix = new_prefix()
    a = engine(root / "a", s3, prefix)
    b = engine(root / "b", s3, prefix)
    c = engine(root / "c", s3, prefix, "--EngineConfig.lazy_fetch=False")
    try:
        box = Sandbox.create(backend="container", client=a.client())
        ctx = box.create_code_context()
        ctx.run_code("import os\ncells = []")
        ids = []
        for _ in range(args.cells):
            ctx.run_code(f"cells.append(os.urandom({args.cell_kib * 1024}))")
            ids.append(box.checkpoint())
        box.kill()
        sizes = []
        for snapshot_id in ids:
            wait_durable(a, snapshot_id)
            sizes.append(a.client().request("GET", f"/snapshots/{snapshot_id}")["size_bytes"])
        uploads = DURABLE.findall((a.home / "engine.log").read_text())
        client = s3.client()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        stored = sum(o["Size"] for page in pages for o in page.get("Contents", []))
        template = template_bytes(client, prefix)
        local = first_result(a, ids[-1])
        fetched = first_result(b, ids[-1])
        settled(b)
        again = first_result(b, ids[-1])
        first_result(c, ids[-1])  # C's template, as B got it above
        by_size = {mib: cached_and_fetched(a, [b, c], mib, args.runs) for mib in args.sizes}
    finally:
        c.close()
        b.close()
        a.close()
        s3.kill()
    sent_mib = sum(float(u[2]) for u in uploads)
    rates = sorted(float(u[5]) / float(u[6]) for u in uploads if float(u[6]) > 0)
    snapshots_stored = max(stored - template, 1)
    lines = [
        "# Snapshot store (issue 24)",
        "",
        f"`benchmarks/bench_store.py --cells {args.cells} --cell-kib {args.cell_kib} "
        f"--sizes {' '.join(map(str, args.sizes))} --runs {args.runs}`: one "
        f"container sandbox, {args.cells} cells each adding {args.cell_kib} KiB of random "
        "data, a checkpoint after each; SeaweedFS on loopback; pages referenced where the "
        "sandbox's previous checkpoint stored them, new ones packed into chunks of up to 4 MiB.",
        "",
        f"- checkpoints' sizes added up: {sum(sizes) / 2**20:.1f} MiB",
        f"- bytes in the bucket (chunks and manifests): {stored / 2**20:.1f} MiB, of which the "
        f"template's build (sent once per fleet) {template / 2**20:.1f} MiB",
        f"- the checkpoints' share: {snapshots_stored / 2**20:.1f} MiB "
        f"(dedup ratio {sum(sizes) / snapshots_stored:.2f}x)",
        f"- chunks sent {sum(int(u[1]) for u in uploads)}, already stored "
        f"{sum(int(u[4]) for u in uploads)}; {sent_mib:.1f} MiB sent",
        f"- upload throughput per snapshot, MiB of snapshot stored per second (median): "
        f"{rates[len(rates) // 2]:.1f} MiB/s"
        if rates
        else "- upload throughput: nothing large enough was sent",
        f"- restore to first result, last checkpoint: on A (local) {local:.2f} s, on B "
        f"(fetched first) {fetched:.2f} s, on B again (now local) {again:.2f} s",
        "",
        f"Restore to first result of a sandbox holding distinct pages (medians of {args.runs}):",
        "",
        "| held | on the engine that has it | fetched lazily | ratio | fetched whole | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {mib} MiB | {statistics.median(h):.2f} s | {statistics.median(lz):.2f} s "
            f"| {statistics.median(lz) / statistics.median(h):.1f}x "
            f"| {statistics.median(w):.2f} s | {statistics.median(w) / statistics.median(h):.1f}x |"
            for mib, (h, lz, w) in by_size.items()
        ),
        "",
        "Each run, all three: "
        + "; ".join(
            f"{mib} MiB: "
            + ", ".join("/".join(f"{t:.2f}" for t in run) for run in zip(*rows, strict=True))
            for mib, rows in by_size.items()
        ),
        "",
        "Lazily: the restore starts once all but the memory pages are here; the lazy-pages "
        "server reads the pages through the engine's lazy server (a FUSE mount), each read "
        "waiting for its own chunks; the lazy server fills the rest once nothing reads. "
        "Whole: every chunk before the restore starts.",
        "",
    ]
    print("\n".join(lines))
    OUT.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
