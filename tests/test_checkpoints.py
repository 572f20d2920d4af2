"""Named checkpoints, the execution ledger and resume with a replay cache."""

from __future__ import annotations

import pytest

from conftest import EngineProcess
from sandfork.sdk import Client, NotFoundError, ReplayMismatch, Sandbox, SandboxTimeout

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]

COUNTING = "echo run >> /root/count && wc -l < /root/count"


def test_resume_replays_then_runs_live(own_engine: EngineProcess) -> None:
    client = own_engine.client()
    sb = Sandbox.create(client=client)
    assert sb.exec(COUNTING).stdout == "1\n"  # seq 1
    ctx = sb.create_code_context()
    ctx.run_code("x = 5")  # seq 2
    sb.checkpoint("after-setup")
    sb.exec("echo after")  # seq 3, after the checkpoint
    original = sb.id
    sb.kill()

    events = client.request("GET", f"/sandboxes/{original}/ledger")["events"]
    assert [(e["type"], e["seq"]) for e in events] == [
        ("sandbox.exec", 1),
        ("sandbox.run_code", 2),
        ("sandbox.checkpoint_created", 2),
        ("sandbox.exec", 3),
    ]
    assert events[2]["name"] == "after-setup"

    own_engine.stop()
    own_engine.start()  # the ledger and the checkpoint survive an engine restart
    client = own_engine.client()
    resumed = Sandbox.resume(original, client=client)
    assert resumed.id != original
    cached = resumed.exec(COUNTING)
    assert cached.stdout == "1\n"
    resumed.create_code_context().run_code("x = 5")  # cached too
    live = resumed.exec("wc -l < /root/count")  # seq 3: past the cache, runs live
    assert live.stdout == "1\n"  # the cached call did not run again
    assert resumed.create_code_context().run_code("x * 2").text == "10"
    resumed_events = resumed.ledger()
    assert [e["seq"] for e in resumed_events] == [1, 2, 3, 4]
    assert resumed_events[2]["request"]["cmd"] == "wc -l < /root/count"

    mismatched = Sandbox.resume(original, client=client)
    with pytest.raises(ReplayMismatch) as info:
        mismatched.exec("echo something else")
    assert info.value.seq == 1
    for s in (resumed, mismatched):
        s.kill()


def test_named_checkpoints_and_missing_ones(client: Client) -> None:
    sb = Sandbox.create(client=client)
    ctx = sb.create_code_context()
    ctx.run_code("stage = 'a'")
    sb.checkpoint("a")
    ctx.run_code("stage = 'b'")
    sb.checkpoint("b")
    at_a = Sandbox.resume(sb.id, "a", client=client)
    at_a.create_code_context().run_code("stage = 'a'")  # seq 1: from the cache
    assert at_a.create_code_context().run_code("stage").text == "'a'"  # seq 2: live
    latest = Sandbox.resume(sb.id, client=client)
    latest.create_code_context().run_code("stage = 'a'")
    latest.create_code_context().run_code("stage = 'b'")
    assert latest.create_code_context().run_code("stage").text == "'b'"
    with pytest.raises(NotFoundError, match="no checkpoint named 'zzz'"):
        Sandbox.resume(sb.id, "zzz", client=client)
    plain = Sandbox.create(client=client)
    with pytest.raises(NotFoundError, match="no checkpoint"):
        Sandbox.resume(plain.id, client=client)
    for s in (sb, at_a, latest, plain):
        s.kill()


APPEND_BY_CODE = "with open('/root/by-code', 'a') as f:\n    f.write('ran\\n')"
APPEND_BY_EXEC = "echo ran >> /root/by-exec"
COUNT_LINES = "wc -l < /root/by-code; wc -l < /root/by-exec"


def test_replayed_calls_with_side_effects_do_not_run_again(client: Client) -> None:
    sb = Sandbox.create(client=client)
    made = [sb]
    try:
        ctx = sb.create_code_context()
        by_code = ctx.run_code(APPEND_BY_CODE)  # seq 1
        by_exec = sb.exec(APPEND_BY_EXEC)  # seq 2
        ctx.run_code("stage = 'setup'")  # seq 3
        sb.checkpoint("setup")
        sb.exec(APPEND_BY_EXEC)  # seq 4, after the checkpoint: never replayed

        resumed = Sandbox.resume(sb.id, client=client)
        made.append(resumed)
        resumed_ctx = resumed.create_code_context()
        assert resumed_ctx.run_code(APPEND_BY_CODE) == by_code  # seq 1: from the cache
        assert resumed.exec(APPEND_BY_EXEC) == by_exec  # seq 2: from the cache
        resumed_ctx.run_code("stage = 'setup'")  # seq 3: from the cache
        assert resumed.exec(COUNT_LINES).stdout == "1\n1\n"  # seq 4: live; nothing re-ran
        resumed_ctx.run_code(APPEND_BY_CODE)  # seq 5: live, so it appends
        resumed.exec(APPEND_BY_EXEC)  # seq 6: live
        assert resumed.exec(COUNT_LINES).stdout == "2\n2\n"
        events = resumed.ledger()
        assert [(e["seq"], e["kind"]) for e in events] == [
            (1, "run_code"),
            (2, "exec"),
            (3, "run_code"),
            (4, "exec"),
            (5, "run_code"),
            (6, "exec"),
            (7, "exec"),
        ]
        assert events[3]["request"]["cmd"] == COUNT_LINES

        changed = Sandbox.resume(sb.id, "setup", client=client)
        made.append(changed)
        changed_ctx = changed.create_code_context()
        changed_ctx.run_code(APPEND_BY_CODE)
        changed.exec(APPEND_BY_EXEC)
        with pytest.raises(ReplayMismatch) as info:
            changed_ctx.run_code("stage = 'other'")  # seq 3 recorded "stage = 'setup'"
        assert info.value.seq == 3
        assert info.value.expected["code"] == "stage = 'setup'"
        assert info.value.got["code"] == "stage = 'other'"
        assert changed_ctx.run_code("stage").text == "'setup'"  # the changed call never ran
        assert changed.exec(COUNT_LINES).stdout == "1\n1\n"

        swapped = Sandbox.resume(sb.id, client=client)
        made.append(swapped)
        swapped_ctx = swapped.create_code_context()
        swapped_ctx.run_code(APPEND_BY_CODE)
        swapped.exec(APPEND_BY_EXEC)
        with pytest.raises(ReplayMismatch) as info:
            swapped.exec("stage = 'setup'")  # seq 3 was a run_code of the same text
        assert info.value.seq == 3
        assert info.value.expected["kind"] == "run_code" and info.value.got["kind"] == "exec"
        assert swapped.exec(COUNT_LINES).stdout == "1\n1\n"  # seq 4: live
    finally:
        for s in made:
            s.kill()


def test_a_failed_call_replays_as_the_same_failure(client: Client) -> None:
    sb = Sandbox.create(client=client)
    made = [sb]
    try:
        with pytest.raises(SandboxTimeout):
            sb.exec("sleep 600", timeout_seconds=2)  # seq 1: it reached the sandbox, failed
        sb.exec(APPEND_BY_EXEC)  # seq 2
        sb.checkpoint()
        failed = sb.ledger()[0]
        assert (failed["seq"], failed["result"]["failed"]["status"]) == (1, 504)

        resumed = Sandbox.resume(sb.id, client=client)
        made.append(resumed)
        with pytest.raises(SandboxTimeout, match="timeout"):
            resumed.exec("sleep 600", timeout_seconds=2)  # seq 1: the same failure, cached
        resumed.exec(APPEND_BY_EXEC)  # seq 2: cached, not run again
        assert resumed.exec("wc -l < /root/by-exec").stdout == "1\n"  # seq 3: live
        assert [e["seq"] for e in resumed.ledger()] == [1, 2, 3]
    finally:
        for s in made:
            s.kill()
