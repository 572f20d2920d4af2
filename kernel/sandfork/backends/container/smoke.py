"""A dump and restore of a real sandbox, run when CRIU is installed: proof that it works here.

The sandbox is the smallest the backend makes: CRIU's own tree as the root (it has a
``sleep``), launched by a shim in its namespaces and group, locked down like every sandbox,
dumped with the options captures use, killed, and restored by a second shim with new pipes;
the restored ``sleep`` must be running. ``criu check`` alone passes on kernels where a dump of
a TCP socket or a network lock fails, so only this tells.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from sandfork.backends.container import layers
from sandfork.backends.container.cgroups import Cgroup, Hierarchy, Limits
from sandfork.backends.container.criu import Criu, CriuError
from sandfork.backends.container.launcher import LaunchConfig
from sandfork.backends.container.shim import EXIT, RECORD
from sandfork.backends.container.shim_pool import ShimPool
from sandfork.backends.container.stdio import RestoreConfig, ShimConfig
from sandfork.backends.processes import kill_process, start_time
from sandfork.templates.initramfs import agent_dir

_WAIT_S = 60.0


def _run_shim(config: ShimConfig) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    directory = Path(config.dir)
    pool = ShimPool(f"smoke-{os.getpid()}", directory / "waiting.log")
    process = pool.start(config)
    pool.close()
    deadline = time.monotonic() + _WAIT_S
    while not (directory / RECORD).exists():
        if (directory / EXIT).exists() or process.poll() is not None:
            reason = (directory / EXIT).read_text() if (directory / EXIT).exists() else "?"
            raise CriuError(f"the smoke test's sandbox did not start: {reason}")
        if time.monotonic() > deadline:
            raise CriuError("the smoke test's sandbox did not start in time")
        time.sleep(0.01)
    return process, json.loads((directory / RECORD).read_text())


def smoke(criu: Criu, tree: Path) -> None:
    """Launch, dump, kill and restore a sandbox over ``tree``; a :class:`CriuError` saying
    what failed."""
    scratch = Path(tempfile.mkdtemp(prefix=".smoke-", dir=tree.parent))
    hierarchy = Hierarchy.detect()
    cgroup = Cgroup(hierarchy, f"sandfork/smoke-{os.getpid()}")
    cgroup.create(Limits(1024 * 2**20, 256, 1))
    shims: list[subprocess.Popen[bytes]] = []
    try:
        first, second = scratch / "first", scratch / "second"
        for directory in (first, second):
            directory.mkdir()
            (directory / "root").mkdir()
            layers.create(directory / f"disk{layers.SUFFIX}", tree)
        disk = first / f"disk{layers.SUFFIX}"
        launch = LaunchConfig(
            root=str(first / "root"),
            upper=str(disk / layers.FS),
            work=str(disk / layers.WORK),
            lower=[str(tree)],
            agent=str(agent_dir()),
            command=["/usr/bin/sleep", "100000"],
        )
        config = ShimConfig(
            dir=str(first), cgroup=cgroup.relative, sockets={}, launch=launch.__dict__
        )
        process, record = _run_shim(config)
        shims.append(process)
        _wait_exec(int(str(record["init"])), launch.command[0])
        images = scratch / "images"
        images.mkdir()
        options = ["-o", "dump.log", "--tcp-established", "--network-lock", "nftables"]
        options.append("--manage-cgroups=ignore")
        dump = subprocess.run(
            criu.command("dump", "-t", str(record["init"]), "-D", str(images), *options),
            env=criu.env(),
            capture_output=True,
        )
        if dump.returncode != 0:
            raise CriuError(f"criu dump fails here: {_last_error(images / 'dump.log')}")
        process.wait(_WAIT_S)
        disk2 = second / f"disk{layers.SUFFIX}"
        restore = RestoreConfig(
            images=str(images),
            links=str(second / "images"),
            root=str(second / "root"),
            upper=str(disk2 / layers.FS),
            work=str(disk2 / layers.WORK),
            lower=[str(tree)],
            pipes={str(k): int(v) for k, v in dict(record["pipes"]).items()},  # type: ignore[call-overload]
            criu=criu.command(),
            criu_path=criu.env()["PATH"],
        )
        config = ShimConfig(
            dir=str(second), cgroup=cgroup.relative, sockets={}, restore=restore.__dict__
        )
        process, restored = _run_shim(config)
        shims.append(process)
        init = restored["init"]
        if not isinstance(init, int) or start_time(init) is None:
            raise CriuError("criu restore reported success but the restored process is gone")
    finally:
        for process in shims:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(_WAIT_S)
                except subprocess.TimeoutExpired:
                    kill_process(process.pid)
        cgroup.remove()
        shutil.rmtree(scratch, ignore_errors=True)


def _wait_exec(pid: int, program: str) -> None:
    """Wait until the launcher ``pid`` has become ``program`` (its setup is done)."""
    deadline = time.monotonic() + _WAIT_S
    while True:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == program.encode():
                return
        except OSError as e:
            raise CriuError("the smoke test's sandbox exited while starting") from e
        if time.monotonic() > deadline:
            raise CriuError("the smoke test's sandbox did not finish starting in time")
        time.sleep(0.01)


def _last_error(log: Path) -> str:
    try:
        errors = [line for line in log.read_text(errors="replace").splitlines() if "Error" in line]
    except OSError:
        return "(no log)"
    return errors[-1].split(":", 1)[-1].strip() if errors else "(no error logged)"
