"""What a container sandbox's control group is given, on both cgroup layouts: its memory,
its tasks and its CPU time (a sandbox of N CPUs gets N periods' worth of each period, as a
VM of N vCPUs can use at most N cores). The hierarchies here are folders of the test's own,
standing in for the kernel's: what is checked is what the engine writes there."""

from __future__ import annotations

from pathlib import Path

from sandfork.agent.workloads import tasks_for_memory
from sandfork.backends.container.cgroups import AGENT_TASKS, Cgroup, Hierarchy, Limits

GROUP = "sandfork/engine/sbx"


def test_a_sandbox_gets_its_memory_tasks_and_cpu_time_on_cgroup_v2(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    for folder in (root, root / "sandfork", root / "sandfork" / "engine"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cgroup.controllers").write_text("cpu memory pids\n")
    Cgroup(Hierarchy(root, {}), GROUP).create(Limits.for_sandbox(512, 2))
    group = root / GROUP
    assert (group / "memory.max").read_text() == str(512 * 2**20)
    assert (group / "pids.max").read_text() == str(tasks_for_memory(512) + AGENT_TASKS)
    assert (group / "cpu.max").read_text() == "200000 100000"
    assert (root / "sandfork" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_a_sandbox_gets_its_memory_tasks_and_cpu_time_on_cgroup_v1(tmp_path: Path) -> None:
    roots = {name: tmp_path / name for name in ("memory", "pids", "cpu")}
    Cgroup(Hierarchy(None, roots), GROUP).create(Limits.for_sandbox(1024, 1))
    assert (roots["memory"] / GROUP / "memory.limit_in_bytes").read_text() == str(2**30)
    assert (roots["pids"] / GROUP / "pids.max").read_text() == str(
        tasks_for_memory(1024) + AGENT_TASKS
    )
    cpu = roots["cpu"] / GROUP
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "100000"
