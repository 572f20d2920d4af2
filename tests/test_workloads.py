"""The guest agent's cgroup policy (limits for a guest's size) and mechanism (a real cgroup v2
group of this host: a process joins it before it runs, a kill reaches daemons that left the
process group), without a VM; ``test_guest_limits.py`` has the same in a guest."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfork.agent.cgroup import Cgroup
from sandfork.agent.workloads import Limits, Workloads


def test_limits_leave_the_agent_room_and_bound_one_exec() -> None:
    one_gib = Limits.for_guest(mem_total_mb=973, task_max=7707)
    assert one_gib.pids_max == 7195
    assert one_gib.unit_pids_max == 486  # one task per 2 MiB
    assert one_gib.agent_memory_mb == 121  # an eighth
    small = Limits.for_guest(mem_total_mb=460, task_max=3600)
    assert (small.unit_pids_max, small.agent_memory_mb) == (256, 96)  # the floors
    tiny = Limits.for_guest(mem_total_mb=460, task_max=700)
    assert tiny.unit_pids_max == tiny.pids_max // 2  # never more than half of all user work
    settings = one_gib.user_settings(frozenset({"cpu", "memory", "pids"}), mem_total_mb=973)
    assert settings == {"cpu.weight": 100, "pids.max": 7195, "memory.max": 852 * 2**20}
    assert one_gib.agent_settings(frozenset({"cpu"})) == {"cpu.weight": 10000}
    assert one_gib.unit_settings(frozenset()) == {}  # no pids controller: nothing to write


def test_without_cgroups_user_work_runs_as_before() -> None:
    none = Workloads()
    assert none.new_exec() is None and none.new_kernel("default-1") is None
    assert none.spawn_argv(None, ["/bin/sh", "-c", "true"]) == ["/bin/sh", "-c", "true"]
    none.release(None)


def _writable_cgroup2() -> Path | None:
    """A cgroup2 mount of this host that root may make groups in, if there is one."""
    if os.geteuid() != 0:
        return None
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, mount_point, fstype, *_ = line.split()
            if fstype == "cgroup2" and os.access(mount_point, os.W_OK):
                return Path(mount_point)
    return None


@pytest.fixture
def group() -> Iterator[Cgroup]:
    mount = _writable_cgroup2()
    if mount is None:
        pytest.skip("no cgroup2 mount to make a group in (run as root)")
    group = Cgroup(mount / f"sandfork-test-{os.getpid()}")
    group.create()
    if not (group.path / "cgroup.kill").exists():
        group.remove()
        pytest.skip("cgroup.kill missing: Linux 5.14 or later needed")
    try:
        yield group
    finally:
        group.kill()
        asyncio.run(asyncio.wait_for(group.emptied(), 60))
        assert group.remove()


def test_a_group_holds_what_its_process_starts_and_a_kill_ends_it_all(
    group: Cgroup, tmp_path: Path
) -> None:
    daemon_pid = tmp_path / "daemon.pid"
    # The command forks at once and its daemon leaves the process group and the session.
    script = f"setsid sh -c 'echo $$ > {daemon_pid}; exec sleep 3600' & exec sleep 3600"
    leader = subprocess.Popen(group.spawn_argv(["/bin/sh", "-c", script]), start_new_session=True)
    try:
        while not daemon_pid.exists() or not daemon_pid.read_text().strip():
            assert leader.poll() is None, "the command ended"
            time.sleep(0.01)
        daemon = int(daemon_pid.read_text())
        assert os.getpgid(daemon) != leader.pid  # out of the process group
        assert set(group.pids()) >= {leader.pid, daemon}
        assert group.populated()
        assert not group.remove()  # busy
        group.kill()
        assert leader.wait(timeout=60) == -9
        asyncio.run(asyncio.wait_for(group.emptied(), 60))
        assert group.pids() == [] and not group.populated()
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()


def test_a_process_that_cannot_join_its_group_does_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    gone = Cgroup(tmp_path / "no-such-group")
    argv = gone.spawn_argv(["/bin/sh", "-c", f"touch {marker}"])
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 125 and not marker.exists(), done
