"""Concurrent clients looping over the whole life of a sandbox, in rounds, while a reader
times the list.

Every client does one cycle per round (create → run_code → snapshot → restore → fork →
kill, each step checked); between two rounds, with every client idle and no sandbox left,
the engine's counts (``GET /v1/engine/stats``, :mod:`sandfork.engine.stats`) and its RSS
are taken. A leak is what grows with the work done: a count that grows by at least one per
cycle from the end of the warm-up round to the end of the run. Used by ``tests/test_load.py``
(leaks, nothing lost) and ``benchmarks/bench_load.py`` (also latency and memory, printed).
"""

from __future__ import annotations

import itertools
import re
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import EngineProcess
from sandfork.sdk import Sandbox

WARM_UP_ROUNDS = 1  # the first round fills caches, pools and the template's boot capture
# Counts that move within a bound of their own, whatever the work done (noise, not leaks):
BOUNDED = {
    # sqlite3 keeps a weak reference to each cursor a connection made, and drops the dead
    # ones only every 200 cursors.
    "objects.weakref.ReferenceType": 200,
    # asyncio keeps a cancelled timer (an agent request's deadline, say) with its context
    # until it is due, or until there are over 100 of them and they are half of all.
    "objects.asyncio.events.TimerHandle": 200,
    "objects._contextvars.Context": 200,
}


@dataclass
class LoadReport:
    """What a load run did and how the engine held up."""

    clients: int
    cycles: int = 0
    operations: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    list_ms: list[float] = field(default_factory=list)  # as a client in its own process saw it
    served_ms: list[float] = field(default_factory=list)  # as the engine logged it
    rss_mb: list[float] = field(default_factory=list)  # after each round, the engine idle
    counts: list[dict[str, int]] = field(default_factory=list)  # likewise, flattened stats

    @property
    def list_p99_ms(self) -> float:
        """99th percentile of ``GET /v1/sandboxes`` as the client saw it, in milliseconds."""
        return _p99(self.list_ms)

    @property
    def served_p99_ms(self) -> float:
        """99th percentile of the engine's own time on ``GET /v1/sandboxes``, in milliseconds."""
        return _p99(self.served_ms)

    def growth(self) -> dict[str, int]:
        """How much each count grew from the end of the warm-up to the end of the run."""
        if len(self.counts) <= WARM_UP_ROUNDS:
            return {}
        first, last = self.counts[WARM_UP_ROUNDS - 1], self.counts[-1]
        return {k: last.get(k, 0) - first.get(k, 0) for k in first.keys() | last.keys()}

    def leaks(self) -> dict[str, list[int]]:
        """The counts that grew at every round after the warm-up, by at least one per cycle
        in all (past their bound, for those in ``BOUNDED``), each with its values after
        every round: a leak grows with every cycle, where a cache filled once, a pool grown
        to its size or a timer not yet due moves a count once or back and forth. The
        engine's tables (``tracked.*``) and the agent requests waiting come back to the same
        size exactly: any growth there is a leak."""
        measured_cycles = self.clients * (len(self.counts) - WARM_UP_ROUNDS)
        leaks = {}
        for key, grown in self.growth().items():
            values = [counts.get(key, 0) for counts in self.counts]
            measured = values[WARM_UP_ROUNDS - 1 :]
            every_round = all(a < b for a, b in itertools.pairwise(measured))
            enough = grown >= measured_cycles + BOUNDED.get(key, 0)
            exact = key.startswith("tracked.") or key == "agent_requests"
            if grown > 0 and (exact or (every_round and enough)):
                leaks[key] = values
        return leaks

    def summary(self) -> str:
        """One paragraph for a person."""
        grown = sorted(self.growth().items(), key=lambda kv: -kv[1])[:5]
        return (
            f"{self.cycles} cycles, {self.operations} operations, {len(self.failures)} failed, "
            f"in {self.seconds:.0f} s; "
            f"GET /v1/sandboxes: {len(self.list_ms)} calls, at the client median "
            f"{statistics.median(self.list_ms or [0]):.1f} ms, p99 {self.list_p99_ms:.1f} ms, "
            f"in the engine median {statistics.median(self.served_ms or [0]):.1f} ms, "
            f"p99 {self.served_p99_ms:.1f} ms; "
            f"engine RSS after each round {[round(mb) for mb in self.rss_mb]} MiB; "
            f"counts grown most after warm-up: {dict(grown)}"
        )


def _p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98] if len(samples) > 1 else 0.0


_SERVED = re.compile(r"tornado\.access: 200 GET /v1/sandboxes \(.*\) ([0-9.]+)ms$")


def served_ms(engine_log: Path, since: int) -> list[float]:
    """The engine's own times of ``GET /v1/sandboxes`` in its log, after byte ``since``."""
    with engine_log.open("rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    return [float(m.group(1)) for line in lines if (m := _SERVED.search(line))]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def flatten(stats: dict[str, Any]) -> dict[str, int]:
    """The counts of ``GET /v1/engine/stats`` as one flat mapping (``objects.TYPE``,
    ``tracked.TABLE``, ``fds``, ...)."""
    flat = {}
    for key, value in stats.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{name}": int(count) for name, count in value.items()})
        else:
            flat[key] = int(value)
    return flat


def _cycle(engine: EngineProcess, worker: int, report: LoadReport, lock: threading.Lock) -> None:
    """create → run_code → snapshot → restore → fork → kill, each step checked."""
    client = engine.client()
    made: list[Sandbox] = []
    try:
        sandbox = Sandbox.create(client=client, metadata={"load_worker": str(worker)})
        made.append(sandbox)
        value = f"w{worker}-{time.monotonic_ns()}"
        assert sandbox.create_code_context().run_code(f"v = {value!r}").error is None
        snapshot_id = sandbox.snapshot().id
        restored = Sandbox.create(from_snapshot=snapshot_id, client=client)
        made.append(restored)
        assert restored.create_code_context().run_code("v").text == repr(value)
        child = restored.fork()
        made.append(child)
        assert child.create_code_context().run_code("v").text == repr(value)
        for sb in reversed(made):
            sb.kill()
        made.clear()
        client.request("DELETE", f"/snapshots/{snapshot_id}")
        with lock:
            report.cycles += 1
            report.operations += 10
    finally:
        for sb in made:
            try:
                sb.kill()
            except Exception:  # the failure that got us here is what gets reported
                pass


def run_load(engine: EngineProcess, clients: int, rounds: int) -> LoadReport:
    """Run ``clients`` workers for ``rounds`` rounds of one cycle each."""
    report = LoadReport(clients)
    lock = threading.Lock()
    assert engine.process is not None
    engine_pid = engine.process.pid

    def measure() -> None:  # every worker is between two rounds: nothing runs
        try:
            report.counts.append(flatten(engine.get("/v1/engine/stats").json()))
            report.rss_mb.append(_rss_mb(engine_pid))
        except Exception:
            report.failures.append(traceback.format_exc(limit=3))

    between_rounds = threading.Barrier(clients, action=measure)

    def worker(n: int) -> None:
        for _ in range(rounds):
            try:
                _cycle(engine, n, report, lock)
            except Exception:
                with lock:
                    report.failures.append(traceback.format_exc(limit=3))
            between_rounds.wait()

    # The reader is its own process, as another client would be: no lock shared with us.
    poller = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("list_poller.py")),
            engine.url,
            engine.api_key,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    log_start = (engine.home / "engine.log").stat().st_size
    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report.seconds = time.monotonic() - started
    out, _ = poller.communicate("stop\n")
    for line in out.splitlines():
        status, elapsed = line.split()
        report.list_ms.append(float(elapsed))
        if status != "200":
            report.failures.append(f"GET /v1/sandboxes: {status}")
    report.served_ms = served_ms(engine.home / "engine.log", log_start)
    return report
