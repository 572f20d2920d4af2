"""The suite's own leak checks: a test that leaves a sandbox or a VM behind fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm

LEAKY = """
import pytest
from conftest import EngineProcess

from sandfork.sdk import Client, Sandbox


@pytest.mark.vm
def test_leaks(client: Client) -> None:
    Sandbox.create(client=client)


def test_after_the_leak(client: Client) -> None:
    assert Sandbox.list(client=client) == []


@pytest.mark.vm
def test_cleans_up(client: Client) -> None:
    Sandbox.create(client=client).kill()


@pytest.mark.vm
def test_leaves_a_vm(own_engine: EngineProcess) -> None:
    Sandbox.create(client=own_engine.client())
    own_engine.stop()  # the VM outlives the engine
"""


def test_leaks_fail_the_test_that_made_them(tmp_path: Path) -> None:
    for helper in ("conftest.py", "vm_guard.py", "machine_report.py", "worktree_guard.py"):
        shutil.copy(Path(__file__).with_name(helper), tmp_path)
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "test_leaky.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout
    assert done.returncode == 1, out
    assert "ERROR test_leaky.py::test_leaks - Failed: test_leaky.py::test_leaks left" in out
    assert "PASSED test_leaky.py::test_after_the_leak" in out  # the leak was killed
    assert "PASSED test_leaky.py::test_cleans_up" in out
    assert "ERROR test_leaky.py::test_cleans_up" not in out
    assert "ERROR test_leaky.py::test_leaves_a_vm - Failed: engine" in out
    assert "sandbox processes left running (now killed)" in out
    assert "2 errors" in out, out
