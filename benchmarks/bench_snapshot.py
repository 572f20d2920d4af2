"""Snapshot, restore and fork against the size of a kernel's state: copy-on-write vs copying.

Starts two engines (state in temporary directories, template and boot captures from the
shared cache): the default one, which maps snapshot memory copy-on-write and stores what
changed, and one with ``--copy-memory``, the way before (all memory copied while paused and at
every restore). For each state size it fills a sandbox's kernel with that many bytes of
distinct pages and measures, medians over ``--runs``:

- snapshot after the whole state changed (time, parent paused, bytes stored);
- a second snapshot after 10 MB changed, and one of an unchanged sandbox (pause, bytes added);
- restore to the first ``run_code`` result, also with the page cache dropped first (root);
- fork to the child's first result, of the filled sandbox and of one restored from its
  snapshot; fork_tree(16) of both with the memory the 16 idle children add (PSS of their QEMU
  processes); 16 sandboxes from the template.

Peers in the same run: CRIU 4 dump/restore of a local Python process holding the same kind
of array, and Kishu's commit/checkout of a local kernel holding it. Writes
``docs/benchmarks/snapshot.json`` and plots (figure against state size) next to it.

    .venv/bin/python benchmarks/bench_snapshot.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import criu_peer, kishu_peer
from peers.held import HELD
from timing import clock

from conftest import EngineProcess
from sandfork.sdk import Client, Sandbox, Snapshot

MIB = 2**20
SIZES = {"100 MB": 100 * MIB, "500 MB": 500 * MIB, "1 GiB": 1024 * MIB, "2 GiB": 2048 * MIB}
OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
FILL = f"import numpy as np\nheld = {HELD}\nint(held.size)"
REWRITE = "held ^= np.uint8({i}); int(held[0] ^ held[-1] >= 0)"  # every page changes
CHANGE_10MB = "held[:10_000_000] += 1; 1"

Rows = dict[str, list[float]]
PAUSED = "snapshot: parent paused (s)"


def _check(sandbox: Sandbox, code: str = "int(held.size)") -> str:
    result = sandbox.create_code_context().run_code(code)
    assert result.error is None, result.error
    return result.text


def _snapshot(client: Client, sandbox: Sandbox) -> Snapshot:
    return Snapshot.get(sandbox.snapshot(), client=client)


def _pss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
    return total


def _drop_caches() -> bool:
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def measure(engine: EngineProcess, size: int, runs: int, full: bool) -> Rows:
    """The figures for one state size on one engine (``full``: also the 16-sandbox ones)."""
    client = engine.client()
    rows: Rows = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    memory_mb = max(1024, size // MIB + 768)
    sb = Sandbox.create(memory_mb=memory_mb, client=client)
    try:
        _check(sb, FILL.format(n=size))
        for i in range(runs):
            _check(sb, REWRITE.format(i=i + 1))
            seconds, snap = clock(lambda: _snapshot(client, sb))
            add("snapshot (s)", seconds)
            add("snapshot: parent paused (s)", snap.paused_ms / 1000)
            add("snapshot: stored (MB)", snap.size_bytes / 1e6)
            _check(sb, CHANGE_10MB)
            again = _snapshot(client, sb)
            add("10 MB changed: paused (s)", again.paused_ms / 1000)
            add("10 MB changed: added (MB)", again.size_bytes / 1e6)
            same = _snapshot(client, sb)
            add("unchanged: added (MB)", same.size_bytes / 1e6)
            for cold in (False, True):
                if cold and not _drop_caches():
                    continue
                seconds, restored = clock(
                    lambda s=same.id: _restored(client, s)  # type: ignore[misc]
                )
                add("restore, page cache dropped (s)" if cold else "restore (s)", seconds)
                if not cold:
                    # A restored sandbox's own snapshots: what an agent's checkpoints cost.
                    _check(restored, CHANGE_10MB)
                    snap_r = _snapshot(client, restored)
                    add("restored, 10 MB changed: paused (s)", snap_r.paused_ms / 1000)
                    add("restored, 10 MB changed: added (MB)", snap_r.size_bytes / 1e6)
                    snap_r.delete()
                    seconds, child = clock(lambda r=restored: _first_result(r.fork()))  # type: ignore[misc]
                    add("restored: fork to first result (s)", seconds)
                    child.kill()
                restored.kill()
            seconds, child = clock(lambda: _first_result(sb.fork()))
            add("fork to first result (s)", seconds)
            child.kill()
            for snap_id in (snap.id, again.id, same.id):
                Snapshot.get(snap_id, client=client).delete()
        if full:
            base = _snapshot(client, sb)
            restored = _restored(client, base.id)
            for parent, label in ((sb, ""), (restored, "restored: ")):
                seconds, children = clock(lambda p=parent: p.fork_tree(16))  # type: ignore[misc]
                add(f"{label}fork_tree(16) (s)", seconds)
                for child in children:
                    _check(child)
                pss = _pss(_pids(engine, children)) / 1e6
                add(f"{label}fork_tree(16): children's PSS (MB)", pss)
                for child in children:
                    child.kill()
            restored.kill()
            base.delete()
            seconds, fresh = clock(lambda: _from_template(client, memory_mb, 16))
            add("16 from template (s)", seconds)
            add("16 from template: PSS (MB)", _pss(_pids(engine, fresh)) / 1e6)
            for sandbox in fresh:
                sandbox.kill()
    finally:
        sb.kill()
    return rows


def _restored(client: Client, snapshot_id: str) -> Sandbox:
    return _first_result(Sandbox.create(from_snapshot=snapshot_id, client=client))


def _first_result(sandbox: Sandbox) -> Sandbox:
    _check(sandbox)
    return sandbox


def _from_template(client: Client, memory_mb: int, count: int) -> list[Sandbox]:
    made = [Sandbox.create(memory_mb=memory_mb, client=client) for _ in range(count)]
    for sandbox in made:
        assert _check(sandbox, "1") == "1"
    return made


def _pids(engine: EngineProcess, sandboxes: list[Sandbox]) -> list[int]:
    return [engine.sandbox_pid(s.id) for s in sandboxes]


def _medians(rows: Rows) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in rows.items()}


def plot(results: dict[str, dict[str, dict[str, float]]], out: Path) -> None:
    """One figure per measure against state size: each engine and peer a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, list[tuple[str, str]]] = {
        "snapshot (s)": [
            ("copy-on-write", "snapshot (s)"),
            ("copying", "snapshot (s)"),
            ("peers", "CRIU dump (s)"),
            ("peers", "Kishu commit (s)"),
        ],
        "parent paused (s)": [
            ("copy-on-write", "snapshot: parent paused (s)"),
            ("copy-on-write", "10 MB changed: paused (s)"),
            ("copy-on-write", "restored, 10 MB changed: paused (s)"),
            ("copying", "snapshot: parent paused (s)"),
        ],
        "restore to first result (s)": [
            ("copy-on-write", "restore (s)"),
            ("copy-on-write", "restore, page cache dropped (s)"),
            ("copying", "restore (s)"),
            ("peers", "CRIU restore (s)"),
            ("peers", "Kishu checkout (s)"),
        ],
        "fork to first result (s)": [
            ("copy-on-write", "fork to first result (s)"),
            ("copy-on-write", "restored: fork to first result (s)"),
            ("copying", "fork to first result (s)"),
            ("copying", "restored: fork to first result (s)"),
        ],
    }
    # One look per source: Sandfork's blue (dashed for a variant), copying orange, peers.
    colours = {"copy-on-write": "tab:blue", "copying": "tab:orange"}
    peers = {"CRIU dump (s)": "tab:green", "CRIU restore (s)": "tab:green"}
    peers |= {"Kishu commit (s)": "tab:red", "Kishu checkout (s)": "tab:red"}
    sizes = list(results["copy-on-write"])
    xs = [SIZES[s] / MIB for s in sizes]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (title, lines) in zip(axes, panels.items(), strict=True):
        seen: set[str] = set()  # a source's second line in a panel is dashed
        for source, name in lines:
            ys = [results[source].get(s, {}).get(name) for s in sizes]
            if any(y is not None for y in ys):
                label = name if source == "peers" else f"{source}: {name}"
                style = "o--" if source in seen and source != "peers" else "o-"
                seen.add(source)
                values = [y if y is not None else float("nan") for y in ys]
                ax.plot(xs, values, style, color=peers.get(name) or colours[source], label=label)
        ax.set(title=title, xlabel="kernel state (MiB)", xscale="log", yscale="log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)


def _table(results: dict[str, dict[str, dict[str, float]]], runs: int) -> None:
    for source, by_size in results.items():
        print(f"\n{source} (median of {runs} runs)")
        names = list(dict.fromkeys(n for r in by_size.values() for n in r))
        print(f"{'':42}" + "".join(f"{s:>11}" for s in by_size))
        for name in names:
            cells = "".join(f"{by_size[s].get(name, float('nan')):11.3f}" for s in by_size)
            print(f"{name:42}{cells}")
    cow, copy, peers = (results[k] for k in ("copy-on-write", "copying", "peers"))
    print()
    for size in cow:
        ratios = {
            "restore vs copying": (cow, "restore (s)", copy, "restore (s)"),
            "pause vs copying": (
                cow,
                "snapshot: parent paused (s)",
                copy,
                "snapshot: parent paused (s)",
            ),
            "restore vs CRIU restore": (cow, "restore (s)", peers, "CRIU restore (s)"),
            "snapshot vs CRIU dump": (cow, "snapshot (s)", peers, "CRIU dump (s)"),
            "restore vs Kishu checkout": (cow, "restore (s)", peers, "Kishu checkout (s)"),
        }
        parts = []
        for label, (a, an, b, bn) in ratios.items():
            if an in a.get(size, {}) and bn in b.get(size, {}):
                parts.append(f"{label} {a[size][an] / b[size][bn]:.2f}x")
        print(f"{size}: " + ", ".join(parts))


def markdown(results: dict[str, dict[str, dict[str, float]]], runs: int) -> str:
    """The figures as one Markdown table per engine and for the peers."""
    parts = []
    for source, by_size in results.items():
        names = list(dict.fromkeys(n for r in by_size.values() for n in r))
        sizes = list(by_size)
        lines = [f"| {source}, median of {runs} | " + " | ".join(sizes) + " |"]
        lines.append("| --- |" + " ---: |" * len(sizes))
        for name in names:
            cells = [by_size[s].get(name) for s in sizes]
            shown = ["" if c is None else f"{c:.3g}" if c < 100 else f"{c:.0f}" for c in cells]
            lines.append(f"| {name} | " + " | ".join(shown) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--no-peers", action="store_true", help="skip CRIU and Kishu")
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw the plot and table from the JSON"
    )
    args = parser.parse_args()
    if args.plot_only:
        saved = json.loads((OUT / "snapshot.json").read_text())
        runs = saved.pop("runs")
        plot(saved, OUT / "snapshot.png")
        (OUT / "snapshot.md").write_text(markdown(saved, runs))
        return

    results: dict[str, dict[str, dict[str, float]]] = {"copy-on-write": {}, "copying": {}}
    results["peers"] = {}
    engines: dict[str, Callable[[Path], EngineProcess]] = {
        "copy-on-write": lambda home: EngineProcess(home),
        "copying": lambda home: EngineProcess(home, "--copy-memory"),
    }
    started = {source: make(scratch("sandfork-bench-")) for source, make in engines.items()}
    try:
        for engine in started.values():
            engine.start()
        for label in args.sizes:  # size by size: a run cut short still has whole sizes
            for source, engine in started.items():
                full = label == "1 GiB" and source == "copy-on-write"
                results[source][label] = _medians(measure(engine, SIZES[label], args.runs, full))
                print(source, label, results[source][label], flush=True)
            if not args.no_peers:
                peers = criu_peer(SIZES[label], args.runs) | kishu_peer(SIZES[label], args.runs)
                results["peers"][label] = peers
                print("peers", label, peers, flush=True)
    finally:
        for engine in started.values():
            engine.close()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "snapshot.json").write_text(json.dumps({"runs": args.runs, **results}, indent=1))
    plot(results, OUT / "snapshot.png")
    (OUT / "snapshot.md").write_text(markdown(results, args.runs))
    _table(results, args.runs)
    print(f"\nwrote {OUT / 'snapshot.json'} and {OUT / 'snapshot.png'}")


if __name__ == "__main__":
    main()
