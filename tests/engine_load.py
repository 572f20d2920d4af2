"""Concurrent clients looping over the whole life of a sandbox, while a reader times the list.

Used by ``tests/test_load.py`` (two minutes in CI) and ``benchmarks/bench_load.py`` (ten).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from conftest import EngineProcess
from sandfork.sdk import Sandbox


@dataclass
class LoadReport:
    """What a load run did and how the engine held up."""

    cycles: int = 0
    operations: int = 0
    failures: list[str] = field(default_factory=list)
    list_ms: list[float] = field(default_factory=list)  # as a client in its own process saw it
    served_ms: list[float] = field(default_factory=list)  # as the engine logged it
    rss_mb: list[float] = field(default_factory=list)

    @property
    def list_p99_ms(self) -> float:
        """99th percentile of ``GET /v1/sandboxes`` as the client saw it, in milliseconds."""
        return _p99(self.list_ms)

    @property
    def served_p99_ms(self) -> float:
        """99th percentile of the engine's own time on ``GET /v1/sandboxes``, in milliseconds."""
        return _p99(self.served_ms)

    @property
    def rss_growth_mb(self) -> float:
        """Growth of the engine's memory over the run once warmed up: the median of the last
        third of the samples (taken every 5 s, the last after every client stopped) against
        that of the middle third. Medians, not single samples: a capture holds a buffer of
        its pages while it compares them, and the allocator gives it back when it likes, so
        one sample swings by tens of MiB either way; a leak moves the whole last third."""
        third = len(self.rss_mb) // 3
        if third == 0:
            return 0.0
        middle = statistics.median(self.rss_mb[third : 2 * third])
        return statistics.median(self.rss_mb[2 * third :]) - middle

    def summary(self) -> str:
        """One paragraph for a person."""
        return (
            f"{self.cycles} cycles, {self.operations} operations, {len(self.failures)} failed; "
            f"GET /v1/sandboxes: {len(self.list_ms)} calls, at the client median "
            f"{statistics.median(self.list_ms or [0]):.1f} ms, p99 {self.list_p99_ms:.1f} ms, "
            f"in the engine median {statistics.median(self.served_ms or [0]):.1f} ms, "
            f"p99 {self.served_p99_ms:.1f} ms; "
            f"engine RSS {self.rss_mb[0] if self.rss_mb else 0:.0f} -> "
            f"{self.rss_mb[-1] if self.rss_mb else 0:.0f} MiB "
            f"(+{self.rss_growth_mb:.1f} MiB after warm-up)"
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


def _cycle(engine: EngineProcess, worker: int, report: LoadReport, lock: threading.Lock) -> None:
    """create → run_code → snapshot → restore → fork → kill, each step checked."""
    client = engine.client()
    made: list[Sandbox] = []
    try:
        sandbox = Sandbox.create(client=client, metadata={"load_worker": str(worker)})
        made.append(sandbox)
        value = f"w{worker}-{time.monotonic_ns()}"
        assert sandbox.create_code_context().run_code(f"v = {value!r}").error is None
        snapshot_id = sandbox.snapshot()
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


def run_load(engine: EngineProcess, clients: int, seconds: float) -> LoadReport:
    """Run ``clients`` looping workers for ``seconds`` (cycles started before the end finish)."""
    report = LoadReport()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    done = threading.Event()
    assert engine.process is not None
    engine_pid = engine.process.pid

    def worker(n: int) -> None:
        while time.monotonic() < deadline:
            try:
                _cycle(engine, n, report, lock)
            except Exception:
                with lock:
                    report.failures.append(traceback.format_exc(limit=3))

    def reader() -> None:
        # Its own process, as another client would be: no lock shared with the workers.
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
        while not done.wait(5):
            report.rss_mb.append(_rss_mb(engine_pid))
        out, _ = poller.communicate("stop\n", timeout=60)
        for line in out.splitlines():
            status, elapsed = line.split()
            report.list_ms.append(float(elapsed))
            if status != "200":
                report.failures.append(f"GET /v1/sandboxes: {status}")

    log_start = (engine.home / "engine.log").stat().st_size
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(clients)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    report.rss_mb.append(_rss_mb(engine_pid))
    report.served_ms = served_ms(engine.home / "engine.log", log_start)
    return report
