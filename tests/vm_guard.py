"""The ``vm`` marker says exactly which tests boot a VM, checked at every run (a plugin of
``conftest.py``).

For the session, a ``qemu-system-x86_64`` put first on ``PATH`` (and so on the ``PATH`` of
everything the tests start: engines, kernels, JupyterLab, template builds) writes one line to
the session's log for each VM it starts, then execs the real QEMU, which keeps its pid and
command line. A test boots a VM when one starts while it is set up, runs or is torn down, or
when a fixture it uses started one as it was set up (a module's shared sandbox: every test
using it needs a VM). A test that passed, boots a VM and lacks the marker, or has it and boots
none, fails at teardown saying which. Only this session's wrapper writes the log, so VMs of
other sessions and engineers on the machine never count; reading it costs one ``stat``.

A test that gives its subprocesses a ``PATH`` of its own puts :func:`guarded_path` in front.
In the suite's container pass (``SANDFORK_TEST_BACKEND=container``) the guard is off: the
sandboxes of tests marked ``vm`` are containers there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

QEMU = "qemu-system-x86_64"
_STARTED = pytest.StashKey[int]()  # the log's size as the test's setup began
_CALL_PASSED = pytest.StashKey[bool]()
_BOOTING_FIXTURES: set[object] = set()  # fixture definitions whose setup started a VM
_LOG: Path | None = None

# A VM is QEMU started with a name (``-name sandfork``); ``--version`` and the like are not.
_WRAPPER = """#!/bin/sh
case " $* " in *" -name "*) echo "$$" >> {log} ;; esac
exec {real} "$@"
"""


def _log_size() -> int:
    return _LOG.stat().st_size if _LOG is not None else 0


def guarded_path(path: str) -> str:
    """``path`` with the session's QEMU wrapper in front, when the guard is on."""
    return f"{_LOG.parent / 'bin'}{os.pathsep}{path}" if _LOG is not None else path


def pytest_configure(config: pytest.Config) -> None:
    global _LOG
    real = shutil.which(QEMU)
    if real is None:  # no VM can boot: nothing to check
        return
    if os.environ.get("SANDFORK_TEST_BACKEND", "vm") != "vm":
        return  # the container pass: sandboxes of tests marked vm are containers then
    folder = Path(tempfile.mkdtemp(prefix="sandfork-vm-guard-"))
    folder.chmod(0o755)  # tests that run as another user start QEMU through it too
    (folder / "bin").mkdir(mode=0o755)
    _LOG = folder / "vms.log"
    _LOG.touch(mode=0o666)
    _LOG.chmod(0o666)
    wrapper = folder / "bin" / QEMU
    wrapper.write_text(_WRAPPER.format(log=_LOG, real=real))
    wrapper.chmod(0o755)
    os.environ["PATH"] = guarded_path(os.environ.get("PATH", ""))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _LOG is not None:
        shutil.rmtree(_LOG.parent, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Iterator[None]:
    before = _log_size()
    try:
        return (yield)
    finally:
        if _log_size() > before:
            _BOOTING_FIXTURES.add(fixturedef)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = _log_size()


def _uses_a_booting_fixture(item: pytest.Item) -> bool:
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return False
    return any(defs[-1] in _BOOTING_FIXTURES for defs in definitions.name2fixturedefs.values())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report: pytest.TestReport = yield
    if call.when == "call":
        item.stash[_CALL_PASSED] = report.passed
    if call.when != "teardown" or _LOG is None or not item.stash.get(_CALL_PASSED, False):
        return report
    booted = _log_size() > item.stash[_STARTED] or _uses_a_booting_fixture(item)
    marked = item.get_closest_marker("vm") is not None
    if booted != marked and report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} boots a VM but is not marked @pytest.mark.vm"
            if booted
            else f"{item.nodeid} is marked @pytest.mark.vm but boots no VM"
        )
    return report
