"""Time travel in a notebook's kernel against issue 14's targets (TCG, 1 GiB of state, 10 MB
changed per cell), through the real proxy kernel ("Python 3 (Sandfork)") driven by
jupyter_client as JupyterLab drives it.

Starts its own engine (state in a temporary directory, template from the shared cache) and
one kernel whose guest holds ``--memory-mb`` MiB of distinct, non-zero pages, then measures,
medians over ``--runs``:

1. per-cell checkpoints (``%checkpoints on``): cells changing 10 MB in place (a new 10 MB each
   time), each sent with its ``cellId``. Per checkpoint: the engine's ``paused_ms`` and the
   bytes it added (``GET /snapshots``), the cell's time to its reply (and idle), the checkpoint's
   wall time (the next request waits for it: a silent ``pass`` sent at the reply is answered
   that much later than on its own). In the kernel that loaded the data: its first checkpoint
   (which stores every page written since the sandbox started), (a) the ones after it (the
   kernel stays in its sandbox; the engine tracks the pages it writes), and (b) after
   ``%rewind 1``;
2. ``%rewind 1`` to first result: one cell, ``%rewind 1`` then ``print(1)``;
3. wake from hibernation to first result (``%hibernate after 1``): once the engine lists the
   sandbox ``hibernated``, an execute of ``print(x)`` to its output;
4. what a hibernated sandbox holds: PSS of its QEMU process (none) and the engine's RAM
   folder (tmpfs), against its QEMU's PSS while running; and what its capture added on disk
   (the engine does not list hibernation captures; this finds it in its state directory).

No peer: nothing else on this machine takes per-cell native checkpoints of a kernel (Kishu's
commit/checkout of a kernel is measured in bench_snapshot.py). Writes
``docs/benchmarks/time_travel.{json,md}``.

    .venv/bin/python benchmarks/bench_time_travel.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_snapshot import FILL, MIB, OUT, _pss
from timing import clock

from conftest import EngineProcess
from kernel_client import execute, kernel_sandbox, sandbox_id, stdout, wait_status
from sandfork.protocol import is_snapshot_id
from sandfork.proxy_kernel.checkpoints import CELL_ID, LINEAGE
from sandfork.sdk import NotFoundError, Snapshot

CHANGED = 10_000_000  # bytes a cell changes
CHANGE = "held[{start}:{start} + 10_000_000] += 1"
PEER = (
    "none: nothing else on this machine takes per-cell native checkpoints of a kernel "
    "(Kishu's commit/checkout is measured in bench_snapshot.py)"
)
Rows = dict[str, list[float]]
FIRST, LOADED = "first checkpoint after loading", "(a) loaded kernel"
RESTORED = "(b) after %rewind"
REWIND, WAKE = "%rewind 1 to first result (s)", "wake from hibernation to first result (s)"
RUNNING, ASLEEP = "QEMU PSS running (MB)", "hibernated: RAM held (MB)"
TARGETS: dict[str, float] = {
    **{f"{kind}: checkpoint paused (ms)": 50 for kind in (LOADED, RESTORED)},
    **{f"{kind}: checkpoint added (MB)": 2 * CHANGED / 1e6 for kind in (LOADED, RESTORED)},
    REWIND: 1.0,
    WAKE: 1.5,
}


def _run(kc: BlockingKernelClient, code: str, **kwargs: Any) -> str:
    """Execute ``code``; what it printed (an error reply fails the benchmark)."""
    messages = execute(kc, code, **kwargs)
    reply = messages[-1]["content"]
    assert reply["status"] == "ok", reply
    return stdout(messages)


def _probe(kc: BlockingKernelClient) -> None:
    """A request no checkpoint follows (silent): answered once the pending one is done."""
    _run(kc, "pass", silent=True, store_history=False)


class Notebook:
    """The kernel under test, its engine and the figures taken from them."""

    def __init__(self, engine: EngineProcess, km: KernelManager, kc: BlockingKernelClient):
        self.engine, self.km, self.kc = engine, km, kc
        self.client = engine.client()
        self.rows: Rows = {}
        self.cells = 0
        self.probe_s = 0.0

    def add(self, name: str, value: float) -> None:
        self.rows.setdefault(name, []).append(value)

    def checkpoint(self, cell_id: str) -> Snapshot:
        """This kernel's checkpoint after cell ``cell_id`` ("": when they were turned on)."""
        lineage = kernel_sandbox(self.km)["checkpoints"]["lineage"]
        return next(
            s
            for s in Snapshot.list(client=self.client)  # newest first
            if s.metadata.get(LINEAGE) == lineage and s.metadata.get(CELL_ID) == cell_id
        )

    def qemu_pss(self) -> int:
        return _pss([self.engine.sandbox_pid(sandbox_id(self.km))])

    def cell(self, kind: str, size: int) -> None:
        """One cell changing 10 MB in place, then the checkpoint that follows it."""
        start = self.cells * CHANGED % (size - CHANGED)
        self.cells += 1
        cell_id = f"cell-{self.cells}"
        code = CHANGE.format(start=start)
        ran, _ = clock(lambda: _run(self.kc, code, cell_id=cell_id))
        waited, _ = clock(lambda: _probe(self.kc))
        snap = self.checkpoint(cell_id)
        self.add(f"{kind}: checkpoint paused (ms)", snap.paused_ms)
        self.add(f"{kind}: checkpoint added (MB)", snap.size_bytes / 1e6)
        self.add(f"{kind}: cell to reply (s)", ran)
        self.add(f"{kind}: checkpoint wall (s)", max(0.0, waited - self.probe_s))
        self.add(f"{kind}: cell + checkpoint (s)", ran + max(0.0, waited - self.probe_s))

    def hibernation_capture(self, sandbox_id: str) -> Snapshot | None:
        """The capture a hibernated sandbox wakes from: the engine does not list it, so it is
        looked for among the snapshot folders of its state directory."""
        for folder in (self.engine.home / "snapshots").iterdir():
            if not is_snapshot_id(folder.name):  # one being written or deleted
                continue
            try:
                snap = Snapshot.get(folder.name, client=self.client)
            except NotFoundError:
                continue
            if snap.metadata.get("hibernation_of") == sandbox_id:
                return snap
        return None


def _tmpfs_bytes(folder: Path) -> int:
    """Bytes the files under ``folder`` take (in tmpfs: RAM)."""
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def _load(nb: Notebook, size: int) -> None:
    """Fill the kernel's state and turn checkpoints on."""
    kc = nb.kc
    _run(kc, FILL.format(n=size) + "\nx = 42")
    nb.probe_s = statistics.median(clock(lambda: _probe(kc))[0] for _ in range(3))
    _run(kc, "%checkpoints on 1000")


def measure(nb: Notebook, size: int, runs: int, step: Callable[[str], None]) -> None:
    """Every other figure, in one kernel: it loads the data once (slow under TCG)."""
    kc = nb.kc
    _load(nb, size)
    nb.add(f"loaded kernel: {RUNNING}", nb.qemu_pss() / 1e6)
    nb.add("probe: silent `pass` round trip (s)", nb.probe_s)
    first = nb.checkpoint("")
    nb.add("%checkpoints on: paused (ms)", first.paused_ms)
    nb.add("%checkpoints on: stored (MB)", first.size_bytes / 1e6)
    step(FIRST)
    loaded = sandbox_id(nb.km)
    nb.cell(FIRST, size)
    for _ in range(runs):
        step(f"checkpoints, {LOADED}")
        nb.cell(LOADED, size)
    assert sandbox_id(nb.km) == loaded  # checkpoints never move the kernel
    for _ in range(runs):
        step(f"%rewind, checkpoints {RESTORED}")
        seconds, printed = clock(lambda: _run(kc, "%rewind 1\nprint(1)"))
        assert printed.splitlines()[-1] == "1", printed
        nb.add(REWIND, seconds)
        _probe(kc)  # the checkpoint after print(1) is taken before the measured cell
        nb.cell(RESTORED, size)
    _run(kc, "%checkpoints off")
    sandbox = sandbox_id(nb.km)
    nb.add(f"{RESTORED}: {RUNNING}", nb.qemu_pss() / 1e6)
    _run(kc, "%hibernate after 1")
    for _ in range(runs):
        step("hibernate and wake")
        wait_status(nb.engine, sandbox, "hibernated", 600)
        try:
            pss = nb.qemu_pss()
        except LookupError:  # no QEMU process: its VM is gone
            pss = 0
        nb.add(ASLEEP, (pss + _tmpfs_bytes(nb.engine.ram_dir)) / 1e6)
        capture = nb.hibernation_capture(sandbox)
        if capture is not None:
            nb.add("hibernated: capture added on disk (MB)", capture.size_bytes / 1e6)
        seconds, printed = clock(lambda: _run(kc, "print(x)"))
        assert printed.strip() == "42", printed
        nb.add(WAKE, seconds)
    _run(kc, "%hibernate off")


def verdicts(medians: dict[str, float]) -> dict[str, tuple[float, bool]]:
    """Each target's limit and whether the median meets it."""
    limits = dict(TARGETS)
    running = medians.get(f"{RESTORED}: {RUNNING}")
    if running is not None:
        limits[ASLEEP] = 0.05 * running  # 5% of what the same sandbox held while running
    return {
        name: (limit, medians[name] <= limit) for name, limit in limits.items() if name in medians
    }


def _shown(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def markdown(medians: dict[str, float], runs: int, memory_mb: int) -> str:
    """The figures as a Markdown table: median, target, met or missed."""
    judged = verdicts(medians)
    lines = [f"| {memory_mb} MiB of state, median of {runs} | median | target | |"]
    lines.append("| --- | ---: | ---: | --- |")
    for name, value in medians.items():
        limit, met = judged.get(name, (None, None))
        target = "" if limit is None else f"<= {_shown(limit)}"
        verdict = "" if met is None else "met" if met else "**missed**"
        lines.append(f"| {name} | {_shown(value)} | {target} | {verdict} |")
    return "\n".join(lines) + f"\n\nPeer: {PEER}.\n"


def _table(medians: dict[str, float], runs: int, memory_mb: int) -> None:
    judged = verdicts(medians)
    print(f"\n{memory_mb} MiB of state, median of {runs} runs")
    for name, value in medians.items():
        limit, met = judged.get(name, (None, None))
        target = "" if limit is None else f"target <= {_shown(limit):>6}"
        verdict = "" if met is None else "met" if met else "MISSED"
        print(f"{name:58}{_shown(value):>9}   {target:17}{verdict}")
    print(f"\npeer: {PEER}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--memory-mb", type=int, default=1024, help="the kernel's state (MiB)")
    args = parser.parse_args()
    size = args.memory_mb * MIB
    vm_memory = max(1024, args.memory_mb + 768)  # the state is built with one temporary copy

    home = Path(tempfile.mkdtemp(prefix="sandfork-bench-time-travel-"))
    engine = EngineProcess(home)
    engine.start()
    os.environ["SANDFORK_API"], os.environ["SANDFORK_API_KEY"] = engine.url, engine.api_key
    columns = (TextColumn("{task.description:40}"), BarColumn(), MofNCompleteColumn())
    rows: Rows = {}
    try:
        with Progress(*columns, TimeElapsedColumn()) as progress:
            task = progress.add_task("kernel, loading the state", total=2 + 3 * args.runs)

            def step(description: str) -> None:
                progress.update(task, advance=1, description=description)

            km, kc = start_new_kernel(
                kernel_name="sandfork",
                startup_timeout=120,
                extra_arguments=["--memory-mb", str(vm_memory)],
            )
            nb = Notebook(engine, km, kc)
            try:
                measure(nb, size, args.runs, step)
            finally:
                kc.stop_channels()
                km.shutdown_kernel()
            rows |= nb.rows
            step("done")
    finally:
        engine.close()
        shutil.rmtree(home, ignore_errors=True)  # the checkpoints: GiBs

    medians = {name: statistics.median(values) for name, values in rows.items()}
    judged = {
        name: {"target": limit, "met": met} for name, (limit, met) in verdicts(medians).items()
    }
    OUT.mkdir(parents=True, exist_ok=True)
    report = {"runs": args.runs, "memory_mb": args.memory_mb, "peer": PEER, "medians": medians}
    report |= {"targets": judged, "samples": rows}
    (OUT / "time_travel.json").write_text(json.dumps(report, indent=1))
    (OUT / "time_travel.md").write_text(markdown(medians, args.runs, args.memory_mb))
    _table(medians, args.runs, args.memory_mb)
    print(f"\nwrote {OUT / 'time_travel.json'} and {OUT / 'time_travel.md'}")


if __name__ == "__main__":
    main()
