"""Named checkpoints, the execution ledger and resume with a replay cache."""

from __future__ import annotations

import pytest
from conftest import EngineProcess

from sandfork.sdk import Client, NotFoundError, ReplayMismatch, Sandbox

pytestmark = pytest.mark.vm

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
