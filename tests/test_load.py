"""Four clients looping over create → run_code → snapshot → restore → fork → kill at once,
in rounds: nothing is lost, and nothing the engine holds grows with the work it has done.

Memory is judged by what the engine holds (``GET /v1/engine/stats``: live objects by type,
fds, threads, tasks, agent requests waiting, its own tables), counted between two rounds
with every client idle, not by its RSS: a capture's page buffer and the allocator move RSS
by tens of MiB either way with no leak (a run of ten rounds measured 138-202 MiB in no order).
Nothing here depends on speed: latency and RSS are ``benchmarks/bench_load.py``'s.
"""

from __future__ import annotations

import pytest

from conftest import EngineProcess
from engine_load import run_load

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]

CLIENTS = 4
ROUNDS = 4  # the first warms up: the leak check sees 12 cycles, 36 sandboxes, 12 snapshots


def test_concurrent_clients_lose_nothing_and_leak_nothing(own_engine: EngineProcess) -> None:
    report = run_load(own_engine, clients=CLIENTS, rounds=ROUNDS)
    print(report.summary())
    assert report.failures == [], "\n".join(report.failures)
    assert report.cycles == CLIENTS * ROUNDS, report.summary()
    assert len(report.counts) == ROUNDS, report.summary()
    assert report.leaks() == {}, report.summary()
    assert own_engine.sandbox_ids() == set()
