"""What else the machine was doing when a test failed (a plugin of ``conftest.py``).

A test that passes alone and fails in CI usually failed for want of CPU: a failed test's
report gets a section with the load average and the processes using the most CPU, so that a
CI log says whether a leftover VM, a runaway guest or another run was eating the machine.
"""

from __future__ import annotations

import subprocess
from collections.abc import Generator
from pathlib import Path

import pytest

TOP = 12  # processes listed


def machine_state() -> str:
    """The load average and the processes using the most CPU now, as text."""
    load = Path("/proc/loadavg").read_text().strip()
    try:
        listing = subprocess.run(
            ["ps", "-eo", "pid,ppid,user,pcpu,rss,etimes,args", "--sort=-pcpu"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        listing = f"(ps failed: {e})\n"
    lines = [line[:200] for line in listing.splitlines()[: TOP + 1]]
    return f"load average: {load}\n" + "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        report.sections.append(("machine at the failure", machine_state()))
    return report
