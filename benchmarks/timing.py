"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def clock(fn: Callable[[], T]) -> tuple[float, T]:
    """Run ``fn`` once; its duration in seconds and its value."""
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    """Durations in seconds of ``runs`` calls of ``fn``."""
    return [clock(fn)[0] for _ in range(runs)]


def ms(samples: list[float]) -> str:
    """Median (and minimum) of durations, in milliseconds."""
    median, low = statistics.median(samples) * 1000, min(samples) * 1000
    return f"{median:9.1f} ms (min {low:.1f}, n={len(samples)})"


def ratio(ours: list[float], peer: list[float]) -> str:
    """How many times slower than the peer our median is."""
    return f"ratio {statistics.median(ours) / statistics.median(peer):.1f}x"
