"""Shared fixtures: a real engine process with its own state directory, booting real VMs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from sandfork.backends.container.backend import engine_groups
from sandfork.backends.container.cgroups import Cgroup, Hierarchy
from sandfork.backends.fake import FakeHost
from sandfork.backends.processes import parent_pid
from sandfork.holdpoints import HOLD_POINTS
from sandfork.sdk import Client, NotFoundError, SandforkError
from sandfork.templates import ensure_template

# jp_fetch & co. for the server extension; the check of the vm marker (tests/vm_guard.py);
# what the machine was doing when a test failed (tests/machine_report.py); no file left in the
# working tree (tests/worktree_guard.py)
pytest_plugins = [
    "pytest_jupyter.jupyter_server",
    "vm_guard",
    "machine_report",
    "worktree_guard",
]

BACKEND = os.environ.get("SANDFORK_TEST_BACKEND", "vm")
"""The backend the suite's engines run sandboxes on unless a test names one: ``vm`` (the
first pass of `scripts/test.sh`, and a plain ``pytest``) or ``container`` (its second pass: the
tests marked ``portable`` or ``any_backend``)."""

SHIM = "sandfork.backends.container.shim"  # a container sandbox's process, as QEMU is a VM's

LEAK_GRACE = 60.0
"""Seconds a sandbox killed asynchronously after a test (a kernel shutting down) may take: a
bound for a hang on a loaded machine, not a speed (the wait ends as soon as it is gone)."""


class EngineProcess:
    """``sandfork serve`` in a subprocess, state under ``home``; restartable."""

    def __init__(self, home: Path, *args: str) -> None:
        self.home = home
        self.args = args
        self.ram_dir = Path(tempfile.mkdtemp(prefix="sandfork-test-", dir="/dev/shm"))
        self.process: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}  # extra environment of the next start()
        self.prefix: tuple[str, ...] = ()  # what runs the engine (`ip netns exec NS`, say)
        self.url = ""
        self.api_key = ""

    def start(self, timeout: float = 120.0) -> None:
        info = self.home / "run" / "engine.json"
        info.unlink(missing_ok=True)
        log = (self.home / "engine.log").open("ab")
        port = [] if "--port" in self.args else ["--port", "0"]  # a free one unless told
        if not any(a.startswith("--EngineConfig.backend") for a in self.args):
            port.append(f"--EngineConfig.backend={BACKEND}")
        self.process = subprocess.Popen(
            [
                *self.prefix,
                sys.executable,
                "-m",
                "sandfork",
                "serve",
                *port,
                "--state-dir",
                str(self.home),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "SANDFORK_HOME": str(self.home),
                "SANDFORK_RAM_DIR": str(self.ram_dir),
                "SANDFORK_HOLD_DIR": str(self.hold_dir),
                **self.env,
            },
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"engine exited: {(self.home / 'engine.log').read_text()[-3000:]}"
                )
            if info.exists():
                self.url = json.loads(info.read_text())["url"]
                self.api_key = (self.home / "run" / "api_key").read_text().strip()
                return
            time.sleep(0.05)
        raise RuntimeError("engine did not start")

    @property
    def hold_dir(self) -> Path:
        """Where the engine's hold points look for their gates (:mod:`sandfork.holdpoints`)."""
        folder = self.home / "holds"
        folder.mkdir(exist_ok=True)
        return folder

    @contextlib.contextmanager
    def holding(self, point: str) -> Iterator[Callable[[], None]]:
        """Park every operation that reaches hold point ``point`` until the block ends;
        yields a function that returns once one is parked there."""
        assert point in HOLD_POINTS, point
        gate = self.hold_dir / point
        gate.touch()

        def parked(timeout: float = 300.0) -> None:  # a bound for a hang, not a speed
            deadline = time.monotonic() + timeout
            while not gate.with_name(f"{point}.held").exists():
                assert time.monotonic() < deadline, f"nothing reached hold point {point}"
                time.sleep(0.01)

        try:
            yield parked
        finally:
            gate.unlink()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(30)

    def close(self) -> None:
        """Stop the engine; fail if it leaves anything behind.

        Sandboxes still listed, RAM files and QEMU processes are all leaks of the tests that
        used the engine: they are removed (so later tests start clean) and reported together
        as one failure.
        """
        problems = []
        try:
            if self.running():
                client = self.client()
                left = self.sandbox_ids()
                for sandbox_id in left:
                    client.request("DELETE", f"/sandboxes/{sandbox_id}")
                if left:
                    problems.append(f"sandboxes left (now killed): {sorted(left)}")
                ram_files = self.wait_for_ram_files_gone()
                if ram_files:
                    problems.append(f"RAM files left after killing every sandbox: {ram_files}")
        except SandforkError as e:
            problems.append(f"the engine failed to kill what was left: {e}")
        finally:
            self.stop()
        pids, groups = self.remove_leftovers()
        if pids:
            problems.append(f"sandbox processes left running (now killed): {pids}")
        if groups:
            problems.append(f"container groups left (now removed): {groups}")
        ram_files = [p for p in self.ram_dir.rglob("*") if p.is_file()]
        if ram_files and not pids:
            problems.append(f"RAM files left behind: {ram_files}")
        shutil.rmtree(self.ram_dir, ignore_errors=True)
        if problems:
            pytest.fail(f"engine {self.home} was left unclean: " + "; ".join(problems))

    def remove_leftovers(self) -> tuple[list[int], list[str]]:
        """Kill what the engine's sandboxes left running (its processes, then its container
        groups), as after the loss of its host; the pids and groups there were."""
        pids = list(self._processes())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        groups = self.container_groups()
        for group in groups:
            group.kill()
            group.remove()
        return pids, [g.relative for g in groups]

    def wait_for_ram_files_gone(self, timeout: float = 120.0) -> list[Path]:
        """The RAM folder's files still there after ``timeout`` (the engine deletes captures
        in the background)."""
        deadline = time.monotonic() + timeout
        while (left := [p for p in self.ram_dir.rglob("*") if p.is_file()]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        return left

    def running(self) -> bool:
        """True while the engine process runs."""
        return self.process is not None and self.process.poll() is None

    def sandbox_ids(self) -> set[str]:
        """Ids of every sandbox the engine lists (dead ones included)."""
        return {item["id"] for item in self.client().request("GET", "/sandboxes")["items"]}

    def client(self) -> Client:
        return Client(self.url, self.api_key)

    def get(self, path: str, **kwargs: object) -> requests.Response:
        return requests.get(f"{self.url}{path}", headers=self.auth, timeout=600, **kwargs)  # type: ignore[arg-type]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def sandbox_pid(self, sandbox_id: str) -> int:
        """The process of one sandbox: its QEMU, or its container's shim (killing it kills
        the sandbox: the engine then ends the container's processes)."""
        for pid in self.sandbox_pids():
            if sandbox_id.encode() in _identity(Path(f"/proc/{pid}")):
                return pid
        raise LookupError(f"no process for sandbox {sandbox_id}")

    def sandbox_gone(self, sandbox_id: str, timeout: float = 120.0) -> bool:
        """Whether the sandbox's process ends within ``timeout`` (a bound for a hang: a
        stopped sandbox's record may say so a moment before its process has exited)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.sandbox_pid(sandbox_id)
            except LookupError:
                return True
            time.sleep(0.05)
        return False

    def sandbox_pids(self) -> list[int]:
        """The process of each of this engine's sandboxes, VM or container; not a shim's own
        children (its lazy-pages server is forked from it and looks just like it)."""
        ours = self._processes()
        return [pid for pid, parent in ours.items() if parent not in ours]

    def _processes(self) -> dict[int, int | None]:
        """Every QEMU or shim process of this engine (their command lines, or a shim's working
        directory, name our home), with its parent's pid (``None`` once it is gone)."""
        found: dict[int, int | None] = {}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                identity = _identity(proc)
                ours = b"qemu-system" in identity or SHIM.encode() in identity
                if ours and str(self.home).encode() in identity:
                    found[int(proc.name)] = parent_pid(int(proc.name))
        return found

    def container_groups(self) -> list[Cgroup]:
        """The control groups this engine's container sandboxes still have."""
        hierarchy = Hierarchy.detect()
        parent = engine_groups(self.home)
        return [Cgroup(hierarchy, f"{parent}/{name}") for name in hierarchy.groups(parent)]


def _identity(proc: Path) -> bytes:
    """A process's command line and working directory (a container sandbox's shim works in
    the sandbox's folder); empty once it is gone."""
    try:
        return (proc / "cmdline").read_bytes() + b"\0" + os.readlink(proc / "cwd").encode()
    except OSError:
        return b""


@pytest.fixture(scope="session")
def template() -> None:
    """The default template, built once (cached across runs in ~/.cache/sandfork)."""
    ensure_template("code-interpreter", progress=True)


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory, template: None) -> Iterator[EngineProcess]:
    """A running engine; on teardown every sandbox is killed and no QEMU may remain."""
    proc = EngineProcess(tmp_path_factory.mktemp("sandfork-home"))
    proc.start()
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def container_engine(
    tmp_path_factory: pytest.TempPathFactory, template: None
) -> Iterator[EngineProcess]:
    """An engine of the module's own whose sandboxes are containers (skips, saying why,
    where they cannot run)."""
    from sandfork.backends.container.backend import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"container sandboxes cannot run here: {reason}")
    proc = EngineProcess(
        tmp_path_factory.mktemp("sandfork-containers"), "--EngineConfig.backend=container"
    )
    proc.start()
    yield proc
    proc.close()


@pytest.fixture
def own_engine(tmp_path_factory: pytest.TempPathFactory, template: None) -> Iterator[EngineProcess]:
    """An engine of one test alone, so restarting or killing it disturbs no other test."""
    proc = EngineProcess(tmp_path_factory.mktemp("sandfork-own"))
    proc.start()
    yield proc
    proc.close()


@pytest.fixture(autouse=True)
def no_leaked_sandboxes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that uses the session's engine and leaves a sandbox of its own behind.

    Sandboxes listed after the test that were not there before it are killed (later tests
    are unaffected) and fail the test; ones a kernel or server kills as it shuts down get a
    few seconds to go.
    """
    if "engine" not in request.fixturenames:
        yield
        return
    engine: EngineProcess = request.getfixturevalue("engine")
    before = engine.sandbox_ids()
    yield
    if not engine.running():
        pytest.fail(f"{request.node.nodeid} stopped the session's engine")
    deadline = time.monotonic() + LEAK_GRACE
    while (leaked := engine.sandbox_ids() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    if leaked:
        client = engine.client()
        for sandbox_id in leaked:
            with contextlib.suppress(NotFoundError):
                client.request("DELETE", f"/sandboxes/{sandbox_id}")
        pytest.fail(
            f"{request.node.nodeid} left sandboxes behind (now killed): {sorted(leaked)}; "
            "kill what a test creates, in a finally block or a fixture"
        )


@pytest.fixture(scope="module")
def kernel_engine_env(engine: EngineProcess) -> Iterator[None]:
    """Kernels started in the module find the test engine through the environment."""
    saved = {k: os.environ.get(k) for k in ("SANDFORK_API", "SANDFORK_API_KEY")}
    os.environ["SANDFORK_API"], os.environ["SANDFORK_API_KEY"] = engine.url, engine.api_key
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def client(engine: EngineProcess) -> Client:
    """An SDK client of the session's engine."""
    return engine.client()


@pytest.fixture
def host() -> Iterator[FakeHost]:
    """The fake host of the tests of the engine's own rules (``tests/engine_fake.py``)."""
    fake = FakeHost()
    yield fake
    fake.close()
