"""Kishu (PyPI ``kishu``) checkpoint/checkout of a local kernel holding the same array.

Kishu versions a notebook kernel's variables. It runs in its own virtualenv (its pins clash
with ours) inside a local ipykernel, in Kishu's test mode: that skips only the front-end calls
(notebook save/reload through JupyterLab), which need a browser, not the checkpoint work.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpec

from peers.held import HELD
from sandfork.paths import cache_dir

NOTEBOOK = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


def _python() -> Path | None:
    venv = cache_dir() / "peers" / "kishu-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "kishu", "ipykernel", "numpy"],
            capture_output=True,
        )
        if done.returncode != 0:
            return None
    return python


def kishu_peer(size: int, runs: int) -> dict[str, float]:
    """Median Kishu checkpoint (of a cell changing the array) and checkout times, in seconds;
    {} if unavailable."""
    python = _python()
    if python is None:
        print("peer Kishu: could not install kishu from PyPI")
        return {}
    work = Path(tempfile.mkdtemp(prefix="kishu-peer-"))
    (work / ".kishu").mkdir()
    (work / ".kishu" / "config.ini").write_text("[JUPYTERINT]\ntest_mode = True\n")
    notebook = work / "bench.ipynb"
    notebook.write_text(NOTEBOOK)
    km = KernelManager()
    km._kernel_spec = KernelSpec(  # a kernel of Kishu's own virtualenv
        argv=[str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        display_name="kishu",
        language="python",
    )
    km.connection_file = str(work / "kernel-kishubench.json")  # Kishu reads the id from it
    km.start_kernel(env={**os.environ, "KISHU_PATH_ROOT": str(work)})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(120)

        def run(code: str) -> float:
            start = time.perf_counter()
            reply = kc.execute_interactive(code, timeout=600, output_hook=lambda msg: None)
            assert reply["content"]["status"] == "ok", reply["content"]
            return time.perf_counter() - start

        run(f"from kishu import init_kishu; init_kishu({str(notebook)!r})")
        run(f"import numpy as np\nheld = {HELD.format(n=size)}")
        commits, checkouts = [], []
        for i in range(runs):
            run(f"_commit = str(_kishu.commit()).strip()  # {i}")
            # Kishu checkpoints after every cell: this cell's time is the checkpoint of the
            # changed array (the assignment itself takes microseconds).
            commits.append(run("held[0] = 9"))
            checkouts.append(run("_kishu.checkout(_commit, skip_notebook=True)"))
            run("assert held[0] == 0, 'the checkout did not bring the array back'")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return {
        "Kishu commit (s)": statistics.median(commits),
        "Kishu checkout (s)": statistics.median(checkouts),
    }
