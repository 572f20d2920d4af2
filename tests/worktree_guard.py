"""A pytest plugin: the suite leaves no file in the working tree.

A test that writes beside the repository (a kernel whose connection file is a bare name
writes its state file into the current folder, say) dirties every checkout it runs in and
can be committed by accident, as twelve kernels' state files once were. Files git does not
know and does not ignore are listed at the start and at the end of the session; any new one
fails the run, named.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent
_KEY = pytest.StashKey[set[str]]()


def _untracked() -> set[str] | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(_ROOT), "ls-files", "--others", "--exclude-standard"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None  # not a git checkout: nothing to compare
    return set(out.splitlines())


def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # xdist's controller checks, once
    found = _untracked()
    if found is not None:
        session.config.stash[_KEY] = found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_KEY, None)
    after = _untracked()
    if before is None or after is None:
        return
    left = sorted(after - before)
    if left:
        print(f"\nthe tests left {len(left)} file(s) in the working tree: {left[:10]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
