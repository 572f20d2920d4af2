"""Container sandboxes against VM sandboxes against a local Python, in one run (issue 20).

Starts two engines (state in temporary folders; templates, CRIU and boot captures from the
shared cache), one whose sandboxes are containers and one whose are VMs (TCG here), and
measures, medians over ``--runs``:

- **compute**: five pieces of work timed inside the sandbox's kernel (so the relay is not
  counted), the same code in a local ipykernel (the peer) taking turns with them; the ratio
  to local;
- **captures**, at each state size (distinct non-zero pages held by the kernel): snapshot
  (and how long the sandbox was frozen), restore to the first ``run_code`` result, fork to
  the child's first result, ``fork_tree(16)`` to every child's first result and the memory
  the 16 idle children take (container: their control groups; VM: their QEMU processes'
  PSS), and create from the template to the first result.

A size whose 16 forks the engine refuses (a 429: this machine's memory cannot hold them) is
skipped with a line saying so. Writes ``docs/benchmarks/backends.{json,md,png}``.

    .venv/bin/python benchmarks/bench_backends.py --runs 5
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers.held import HELD
from timing import clock

from conftest import EngineProcess
from sandfork.backends.container.backend import engine_groups
from sandfork.backends.container.cgroups import Cgroup, Hierarchy
from sandfork.sdk import Sandbox, Snapshot
from sandfork.sdk.errors import LimitExceeded

MIB = 2**20
SIZES = {"100 MB": 100 * MIB, "1 GiB": 1024 * MIB, "2 GiB": 2048 * MIB}
OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
BACKENDS = ("container", "vm")

#: name -> (setup, timed): the timed part prints its own duration in seconds.
WORK = {
    "numpy 500x500 matmul x5": (
        "import numpy as np; a = np.random.rand(500, 500)",
        "for _ in range(5): a @ a",
    ),
    "python -c 'import pandas'": (
        "import subprocess, sys",
        "subprocess.run([sys.executable, '-c', 'import pandas'], check=True)",
    ),
    "pandas groupby-mean, 1e6 rows": (
        "import numpy as np, pandas as pd\n"
        "df = pd.DataFrame({'k': np.random.randint(0, 1000, 1_000_000),"
        " 'v': np.random.rand(1_000_000)})",
        "df.groupby('k').v.mean()",
    ),
    "sum(i*i for i in range(2_000_000))": ("", "sum(i * i for i in range(2_000_000))"),
    "2,000 small files": (
        "import os, tempfile; d = tempfile.mkdtemp()",
        "for i in range(2000):\n"
        "    with open(os.path.join(d, str(i)), 'w') as f: f.write('x' * 1024)\n"
        "for i in range(2000):\n"
        "    with open(os.path.join(d, str(i))) as f: f.read()",
    ),
}
_TIMED = "import time as _t\n_s = _t.perf_counter()\n{body}\nprint(_t.perf_counter() - _s)"

Rows = dict[str, list[float]]


def _run(sandbox: Sandbox, code: str) -> str:
    result = sandbox.create_code_context().run_code(code)
    assert result.error is None, result.error
    return result.stdout or result.text or ""


class LocalKernel:
    """The peer: an ipykernel on this host, started and driven with jupyter_client."""

    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3")

    def run(self, code: str) -> str:
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                raise RuntimeError(msg["content"]["evalue"])

        self.client.execute_interactive(code, output_hook=hook, timeout=600)
        return "".join(out)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


Runner = Callable[[str], str]


def compute(runners: dict[str, Runner], runs: int) -> dict[str, dict[str, float]]:
    """Median seconds of each piece of work on each runner; the runners take turns at every
    run, so a drift of the machine's speed falls on all of them alike."""
    times: dict[str, dict[str, list[float]]] = {name: {} for name in runners}
    for work, (setup, body) in WORK.items():
        for run in runners.values():
            if setup:
                run(setup)
        for _ in range(runs):
            for name, run in runners.items():
                seconds = float(run(_TIMED.format(body=body)))
                times[name].setdefault(work, []).append(seconds)
    return {name: _medians(rows) for name, rows in times.items()}


def _memory(engine: EngineProcess, backend: str, sandboxes: list[Sandbox]) -> float:
    """MB the idle ``sandboxes`` take: container groups' charge, or QEMU processes' PSS."""
    if backend == "vm":
        total = 0
        for sandbox in sandboxes:
            rollup = Path(f"/proc/{engine.sandbox_pid(sandbox.id)}/smaps_rollup").read_text()
            total += sum(
                int(line.split()[1]) * 1024
                for line in rollup.splitlines()
                if line.startswith("Pss:")
            )
        return total / 1e6
    hierarchy, parent = Hierarchy.detect(), engine_groups(engine.home)
    used = sum(Cgroup(hierarchy, f"{parent}/{s.id}").memory_bytes() for s in sandboxes)
    return used / 1e6


def captures(engine: EngineProcess, backend: str, size: int, runs: int) -> Rows:
    """Snapshot, restore, fork and fork_tree(16) of a sandbox holding ``size`` bytes."""
    client = engine.client()
    rows: Rows = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    memory_mb = max(1024, size // MIB + 768)
    for _ in range(runs):
        seconds, fresh = clock(lambda: _first(Sandbox.create(memory_mb=memory_mb, client=client)))
        add("create to first result (s)", seconds)
        fresh.kill()
    parent = Sandbox.create(memory_mb=memory_mb, client=client)
    try:
        _run(parent, f"import numpy as np\nheld = {HELD.format(n=size)}\nint(held.size)")
        for i in range(runs):
            _run(parent, f"held ^= np.uint8({i + 1}); 1")
            seconds, snap_id = clock(parent.snapshot)
            snap = Snapshot.get(snap_id, client=client)
            add("snapshot (s)", seconds)
            add("snapshot: sandbox frozen (s)", snap.paused_ms / 1000)
            add("snapshot: stored (MB)", snap.size_bytes / 1e6)
            restore = functools.partial(Sandbox.create, from_snapshot=snap_id, client=client)
            seconds, restored = clock(lambda: _first(restore()))  # noqa: B023 (called at once)
            add("restore to first result (s)", seconds)
            restored.kill()
            seconds, child = clock(lambda: _first(parent.fork()))
            add("fork to child's first result (s)", seconds)
            child.kill()
            snap.delete()
        try:  # the engine refuses what this machine's memory cannot hold
            seconds, children = clock(lambda: [_first(c) for c in parent.fork_tree(16)])
        except LimitExceeded as e:
            print(f"{backend} {size // MIB} MiB: fork_tree(16) refused by the engine: {e}")
        else:
            add("fork_tree(16) to every first result (s)", seconds)
            add("16 idle forks: memory (MB)", _memory(engine, backend, children))
            for child in children:
                child.kill()
    finally:
        parent.kill()
    return rows


def _first(sandbox: Sandbox) -> Sandbox:
    assert _run(sandbox, "1") == "1"
    return sandbox


def _medians(rows: Rows) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in rows.items()}


def markdown(results: dict[str, object], runs: int) -> str:
    """The figures as Markdown tables: compute with ratios, then captures per size."""
    work = results["compute"]
    assert isinstance(work, dict)
    lines = [
        f"| work (median of {runs}) | container | VM | local | container / local | VM / local |"
    ]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in WORK:
        c, v, local = (work.get(k, {}).get(name) for k in ("container", "vm", "local"))
        ratios = ["" if x is None or not local else f"{x / local:.2f}x" for x in (c, v)]
        cells = ["" if x is None else f"{x:.3f} s" for x in (c, v, local)]
        lines.append(f"| {name} | " + " | ".join(cells + ratios) + " |")
    tables = ["\n".join(lines)]
    for backend in BACKENDS:
        by_size = results.get(backend)
        if not isinstance(by_size, dict):
            continue
        names = list(dict.fromkeys(n for r in by_size.values() for n in r))
        sizes = list(by_size)
        rows = [f"| {backend}, median of {runs} | " + " | ".join(sizes) + " |"]
        rows.append("| --- |" + " ---: |" * len(sizes))
        for name in names:
            cells = [by_size[s].get(name) for s in sizes]
            rows.append(
                f"| {name} | " + " | ".join("" if c is None else f"{c:.3g}" for c in cells) + " |"
            )
        tables.append("\n".join(rows))
    return "\n\n".join(tables) + "\n"


def plot(results: dict[str, object], out: Path) -> None:
    """Compute ratios, and each capture measure against state size for both backends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    work = results["compute"]
    assert isinstance(work, dict)
    measures = ["snapshot (s)", "restore to first result (s)", "fork to child's first result (s)",
                "fork_tree(16) to every first result (s)"]  # fmt: skip
    fig, axes = plt.subplots(1, 1 + len(measures), figsize=(5 * (1 + len(measures)), 4))
    names = list(WORK)
    for offset, backend in enumerate(b for b in BACKENDS if b in work):
        ratios = [work[backend][n] / work["local"][n] for n in names]
        axes[0].barh(
            [i + 0.4 * offset for i in range(len(names))], ratios, height=0.4, label=backend
        )
    axes[0].set(title="compute: time / local Python", xscale="log", yticks=range(len(names)))
    axes[0].set_yticklabels(names, fontsize=7)
    axes[0].axvline(1.0, color="grey", lw=0.5)
    axes[0].legend(fontsize=7)
    for ax, measure in zip(axes[1:], measures, strict=True):
        sizes: set[float] = set()
        for backend in BACKENDS:
            by_size = results.get(backend)
            if not isinstance(by_size, dict):
                continue
            xs = [SIZES[s] / MIB for s in by_size if measure in by_size[s]]
            ys = [by_size[s][measure] for s in by_size if measure in by_size[s]]
            ax.plot(xs, ys, "o-", label=backend)
            sizes.update(xs)
        ax.set(title=measure, xlabel="kernel state (MiB)")
        if len(sizes) > 1:  # a run of one size has no scale to show
            ax.set(xscale="log", yscale="log")
        if sizes:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the json, md and png")
    args = parser.parse_args()
    results: dict[str, object] = {"runs": args.runs}
    engines = {
        b: EngineProcess(scratch(f"sandfork-bench-{b}-"), f"--EngineConfig.backend={b}")
        for b in args.backends
    }
    local = LocalKernel()
    boxes: list[Sandbox] = []
    try:
        runners: dict[str, Runner] = {}
        for backend, engine in engines.items():
            engine.start()
            boxes.append(Sandbox.create(client=engine.client()))
            runners[backend] = functools.partial(_run, boxes[-1])
        runners["local"] = local.run
        work = compute(runners, args.runs)
        for box in boxes:
            box.kill()
        print("compute", work, flush=True)
        results["compute"] = work
        for label in args.sizes:
            for backend, engine in engines.items():
                by_size = results.setdefault(backend, {})
                assert isinstance(by_size, dict)
                by_size[label] = _medians(captures(engine, backend, SIZES[label], args.runs))
                print(backend, label, by_size[label], flush=True)
    finally:
        local.close()
        for engine in engines.values():
            engine.close()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "backends.json").write_text(json.dumps(results, indent=1))
    text = markdown(results, args.runs)
    (out / "backends.md").write_text(text)
    plot(results, out / "backends.png")
    print(text)
    print(f"wrote {out / 'backends.json'}, .md and .png (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
