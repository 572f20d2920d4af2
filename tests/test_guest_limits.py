"""User work in the guest runs in cgroups of its own: a fork bomb is contained and killed.

Every ``exec`` runs in a cgroup of its own under the guest's ``user`` cgroup, with a pid
limit; the agent lives in a cgroup the user's work cannot exhaust and has the CPU first. A
timeout kills the exec's whole cgroup (``cgroup.kill``), daemons that left its process group
included, and the sandbox answers at once afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from conftest import EngineProcess
from sandfork.sdk import Sandbox, SandboxTimeout

pytestmark = pytest.mark.vm

# Fork bombs that keep their exec running (each level waits for the two it started, and
# starts them again when they end or cannot fork), so that the exec ends by its timeout.
BOMB = "bomb() { while :; do bomb | bomb; done; }; bomb"
BOMB_MARK = "bomb | bomb"
# The classic `:(){ :|:& };:` (dash does not take ':' as a function name): the exec ends at
# once, the bomb goes on in the background.
CLASSIC_BOMB = "boom() { boom | boom & }; boom"
# The same in Python: os.fork in a loop, children forking too.
PY_BOMB = "exec python3 -c 'import os\nwhile True:\n    try: os.fork()\n    except OSError: pass'"
PY_BOMB_MARK = "os.fork()"


@pytest.fixture
def sandbox(engine: EngineProcess) -> Iterator[Sandbox]:
    sb = Sandbox.create(client=engine.client())
    try:
        yield sb
    finally:
        sb.kill()


def _processes(sb: Sandbox) -> list[str]:
    """Every process of the guest, one ``pid args`` line each (this ps left out)."""
    lines = sb.exec("ps -eo pid=,args=", timeout_seconds=60).stdout.splitlines()
    return [line for line in lines if "ps -eo" not in line]


@pytest.mark.parametrize(
    ("cmd", "mark"), [(BOMB, BOMB_MARK), (PY_BOMB, PY_BOMB_MARK)], ids=["sh", "python"]
)
def test_fork_bomb_times_out_and_the_sandbox_answers_right_after(
    sandbox: Sandbox, cmd: str, mark: str
) -> None:
    ctx = sandbox.create_code_context()
    assert ctx.run_code("1 + 1").text == "2"
    with pytest.raises(SandboxTimeout):
        sandbox.exec(cmd, timeout_seconds=8)
    assert sandbox.exec("echo ok").stdout == "ok\n"
    assert ctx.run_code("21 * 2").text == "42"
    left = [line for line in _processes(sandbox) if mark in line]
    assert not left, f"{len(left)} processes of the bomb are left, e.g. {left[:3]}"


# Run in the bomb's sandbox after the checks: kills every exec group that hit its pid limit
# (the bomb's), saying so, which shows that the bomb still ran while the checks did.
KILL_BOMBS = (
    "for g in /sys/fs/cgroup/user/exec-*; do"
    " grep -q 'max [1-9]' $g/pids.events && echo 1 > $g/cgroup.kill && echo killed;"
    " done; true"
)


def test_sandboxes_answer_while_a_fork_bomb_runs(engine: EngineProcess, sandbox: Sandbox) -> None:
    other = Sandbox.create(client=engine.client())
    try:
        other_ctx = other.create_code_context()
        assert other_ctx.run_code("'warm'").text == "'warm'"
        ctx = sandbox.create_code_context()
        assert ctx.run_code("'warm'").text == "'warm'"
        at_limit = threading.Event()  # the shell said it cannot fork: the bomb is at its limit
        outcome: list[int | BaseException] = []

        def on_stderr(chunk: str) -> None:
            if "fork" in chunk.lower():
                at_limit.set()

        def bomb() -> None:
            try:  # the timeout only bounds a failure: the test ends the bomb itself
                outcome.append(sandbox.exec_stream(BOMB, on_stderr=on_stderr, timeout_seconds=900))
            except BaseException as exc:  # reported by the main thread
                outcome.append(exc)
            at_limit.set()

        runner = threading.Thread(target=bomb, daemon=True)
        runner.start()
        at_limit.wait()
        assert not outcome, f"the bomb ended before reaching its limit: {outcome}"
        # The other sandbox, and the bomb's own agent and kernel, answer meanwhile.
        assert other.exec("echo ok").stdout == "ok\n"
        assert other_ctx.run_code("6 * 7").text == "42"
        assert sandbox.exec("echo alive").stdout == "alive\n"
        assert ctx.run_code("6 * 7").text == "42"
        assert sandbox.exec(KILL_BOMBS).stdout == "killed\n", "the bomb was not running"
        runner.join()
        assert outcome == [137], outcome  # killed by SIGKILL
        assert sandbox.exec("echo ok").stdout == "ok\n"
    finally:
        other.kill()


def test_a_fork_bomb_left_running_is_killed_at_its_pid_limit(sandbox: Sandbox) -> None:
    # The classic bomb returns at once and forks on in the background; what a finished exec
    # leaves lives on (`server &`), unless it hits the exec's pid limit.
    ctx = sandbox.create_code_context()
    assert ctx.run_code("1 + 1").text == "2"
    assert sandbox.exec(CLASSIC_BOMB, timeout_seconds=60).exit_code == 0
    gone = "while ps -eo args= | grep -q '[b]oom | boom'; do :; done; echo gone"
    assert sandbox.exec(gone, timeout_seconds=300).stdout == "gone\n"
    assert sandbox.exec("echo ok").stdout == "ok\n"
    assert ctx.run_code("21 * 2").text == "42"


def test_a_timeout_kills_daemons_that_left_the_process_group(sandbox: Sandbox) -> None:
    # Two daemons: one in a session of its own (setsid), one nohup'ed in the background; the
    # command waits until both wrote their pid, then outlives its timeout.
    cmd = (
        "rm -f /tmp/d1 /tmp/d2; "
        "setsid sh -c 'echo $$ > /tmp/d1; exec sleep 31337' >/dev/null 2>&1 < /dev/null & "
        "nohup sh -c 'echo $$ > /tmp/d2; exec sleep 31338' >/dev/null 2>&1 & "
        "while [ ! -s /tmp/d1 ] || [ ! -s /tmp/d2 ]; do :; done; "
        "echo up; exec sleep 100000"
    )
    with pytest.raises(SandboxTimeout):
        sandbox.exec(cmd, timeout_seconds=5)
    daemons = [line for line in _processes(sandbox) if "sleep 3133" in line]
    assert not daemons, f"daemons survived the timeout: {daemons}"


def test_a_finished_exec_may_leave_a_daemon_and_its_cgroup_goes_with_it(sandbox: Sandbox) -> None:
    # As before cgroups: `server &` outlives the exec that started it.
    sandbox.exec(
        "setsid sh -c 'echo $$ > /tmp/d3; exec sleep 31339' >/dev/null 2>&1 < /dev/null & "
        "while [ ! -s /tmp/d3 ]; do :; done",
        timeout_seconds=60,
    )
    assert [line for line in _processes(sandbox) if "sleep 31339" in line]
    groups = "ls /sys/fs/cgroup/user"
    before = set(sandbox.exec(groups).stdout.split())
    # Killed, and waited for until PID 1 has reaped it.
    gone = "kill $(cat /tmp/d3); while kill -0 $(cat /tmp/d3) 2>/dev/null; do :; done; echo gone"
    assert sandbox.exec(gone).stdout == "gone\n"
    # The daemon's cgroup is removed once empty; finished execs leave none behind.
    after = set(sandbox.exec(groups).stdout.split())
    execs = {name for name in after if name.startswith("exec-")}
    assert len(execs) == 1, after  # the `ls` exec's own
    assert not (execs & before), (before, after)


def test_closing_a_context_kills_what_its_kernel_started(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context(isolated=True)
    started = ctx.run_code(
        "import subprocess\n"
        "daemon = subprocess.Popen(['sleep', '31340'], start_new_session=True)\n"
        "daemon.pid"
    )
    assert started.error is None, started.error
    assert [line for line in _processes(sandbox) if "sleep 31340" in line]
    ctx.close()
    left = [line for line in _processes(sandbox) if "sleep 31340" in line]
    assert not left, f"the kernel's daemon outlived it: {left}"
