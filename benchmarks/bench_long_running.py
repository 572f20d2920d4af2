"""Captures of a long-running sandbox (issue 22): one created from the template that then
wrote 1 GiB, as a notebook kernel that loaded its data this morning is.

Starts two engines (state in temporary directories, template and boot captures from the
shared cache): the default one, which tracks the pages each VM writes (a userfaultfd in
asynchronous write-protect mode registered inside QEMU, scanned with PAGEMAP_SCAN), and one
with ``--no-track-writes``, which compares every page written since the sandbox started at
each capture (the way before, the peer here). Per run, on each: a new sandbox from the
template writes ``--memory-mb`` MiB of distinct pages, then

- its first snapshot: time to return, sandbox paused, time until its memory is written;
- ten snapshots, each after 10 MB changed: sandbox paused, bytes added;
- a fork to the child's first result;
- fork_tree(16) to every child's first result.

Medians over ``--runs``; the issue's targets beside them. Writes
``docs/benchmarks/long_running.{json,md,png}``.

    .venv/bin/python benchmarks/bench_long_running.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_snapshot import CHANGE_10MB, FILL, MIB, OUT, _check, _first_result

from conftest import EngineProcess
from sandfork.sdk import Client, Sandbox, Snapshot

Rows = dict[str, list[float]]
FIRST, FIRST_PAUSED = "first snapshot: returned (s)", "first snapshot: paused (s)"
FIRST_WRITTEN = "first snapshot: memory written (s)"
PAUSED, ADDED = "10 MB changed: paused (s)", "10 MB changed: added (MB)"
FORK_RETURNED, FORK = "fork: returned (s)", "fork to first result (s)"
TREE = "fork_tree(16) to every first result (s)"
TARGETS = {FIRST: 1.0, PAUSED: 0.05, ADDED: 30.0, FORK: 0.5, TREE: 3.0}
ENGINES = {"tracked": (), "compared (--no-track-writes)": ("--no-track-writes",)}


def _written(client: Client, snapshot_id: str) -> None:
    """Return once the snapshot's memory is on disk (a bound for a hang, not a speed)."""
    deadline = time.monotonic() + 600
    while Snapshot.get(snapshot_id, client=client).storage == "writing":
        assert time.monotonic() < deadline, f"snapshot {snapshot_id} is still being written"
        time.sleep(0.01)


def measure(engine: EngineProcess, size: int, rows: Rows) -> None:
    """One run: a long-running sandbox, its captures, a fork and a fork tree."""
    client = engine.client()

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    sandbox = Sandbox.create(memory_mb=size // MIB + 768, client=client)
    try:
        _check(sandbox, FILL.format(n=size))
        started = time.perf_counter()
        first = Snapshot.get(sandbox.snapshot().id, client=client)
        add(FIRST, time.perf_counter() - started)
        add(FIRST_PAUSED, first.paused_ms / 1000)
        _written(client, first.id)
        add(FIRST_WRITTEN, time.perf_counter() - started)
        for _ in range(10):
            _check(sandbox, CHANGE_10MB)
            snap = Snapshot.get(sandbox.snapshot().id, client=client)
            add(PAUSED, snap.paused_ms / 1000)
            _written(client, snap.id)  # comparing a gigabyte is written after returning too
            add(ADDED, Snapshot.get(snap.id, client=client).size_bytes / 1e6)
        started = time.perf_counter()
        child = sandbox.fork()
        add(FORK_RETURNED, time.perf_counter() - started)
        _first_result(child)
        add(FORK, time.perf_counter() - started)
        child.kill()
        started = time.perf_counter()
        children = sandbox.fork_tree(16)
        for child in children:
            _check(child)
        add(TREE, time.perf_counter() - started)
        for child in children:
            child.kill()
        for old in Snapshot.list(client=client):
            old.delete()
    finally:
        sandbox.kill()


def plot(medians: dict[str, dict[str, float]], out: Path) -> None:
    """Each measure a panel: the engines' medians side by side, the target a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [FIRST, FIRST_PAUSED, PAUSED, ADDED, FORK, TREE]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.6))
    for ax, name in zip(axes, names, strict=True):
        labels = list(medians)
        values = [medians[label].get(name, float("nan")) for label in labels]
        ax.bar(range(len(labels)), values, color=["tab:blue", "tab:orange"][: len(labels)])
        ax.set_xticks(range(len(labels)), [label.split(" ")[0] for label in labels])
        if name in TARGETS:
            ax.axhline(TARGETS[name], color="tab:red", linestyle="--", label="target")
            ax.legend(fontsize=7)
        ax.set_title(name, fontsize=8)
    fig.tight_layout()
    fig.savefig(out)


def markdown(medians: dict[str, dict[str, float]], runs: int, memory_mb: int) -> str:
    """One table: a row per measure, a column per engine, the target and whether it is met."""
    labels = list(medians)
    lines = [f"| {memory_mb} MiB written, median of {runs} | " + " | ".join(labels) + " | target |"]
    lines.append("| --- |" + " ---: |" * len(labels) + " --- |")
    for name in dict.fromkeys(n for by in medians.values() for n in by):
        cells = [f"{medians[label].get(name, float('nan')):.3g}" for label in labels]
        target = ""
        if name in TARGETS:
            met = medians[labels[0]].get(name, float("inf")) <= TARGETS[name]
            target = f"<= {TARGETS[name]:g}: {'met' if met else '**missed**'}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {target} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--memory-mb", type=int, default=1024, help="what the sandbox writes")
    args = parser.parse_args()
    samples: dict[str, Rows] = {}
    for label, options in ENGINES.items():
        engine = EngineProcess(scratch("sandfork-bench-long-"), *options)
        engine.start()
        try:
            for run in range(args.runs):
                measure(engine, args.memory_mb * MIB, samples.setdefault(label, {}))
                print(label, f"run {run + 1}/{args.runs}", flush=True)
        finally:
            engine.close()
    medians = {
        label: {name: statistics.median(values) for name, values in rows.items()}
        for label, rows in samples.items()
    }
    OUT.mkdir(parents=True, exist_ok=True)
    report = {"runs": args.runs, "memory_mb": args.memory_mb, "medians": medians}
    report |= {"targets": TARGETS, "samples": samples}
    (OUT / "long_running.json").write_text(json.dumps(report, indent=1))
    (OUT / "long_running.md").write_text(markdown(medians, args.runs, args.memory_mb))
    plot(medians, OUT / "long_running.png")
    print(markdown(medians, args.runs, args.memory_mb))
    tracked, compared = (medians[label] for label in ENGINES)
    for name in tracked:
        if compared.get(name):
            print(f"{name}: tracked/compared {tracked[name] / compared[name]:.2f}x")


if __name__ == "__main__":
    main()
