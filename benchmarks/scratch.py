"""Scratch folders for the benchmarks' engines, removed when the benchmark ends.

A benchmark's engines keep their snapshots there: a run at 1 GiB leaves gigabytes behind
(one run of ``bench_store.py`` left 16 GB), so a machine that runs them now and then would
fill its disk.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path


def scratch(prefix: str) -> Path:
    """A new folder under the system's temporary folder, deleted at the benchmark's exit."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(functools.partial(shutil.rmtree, path, ignore_errors=True))
    return path
