"""A large first capture returns before its memory is on disk: listed ``writing``, then
``local``; a restore waits for the write; an engine killed mid-write loses no sandbox and
lists no snapshot that cannot restore.

The sandbox is a long-running one (created from the template, then 200 MB written), so its
first capture has more memory to store than a capture writes before returning. The hold
point ``snapshot.writing`` parks the write, so each test acts while it is surely under way.
"""

from __future__ import annotations

import signal
import threading

import pytest

from conftest import EngineProcess
from engine_invariants import check_engine
from sandfork.sdk import NotFoundError, Sandbox, Snapshot

pytestmark = [pytest.mark.vm, pytest.mark.vm_only]

FILL = (
    "import hashlib, numpy as np\n"
    "held = np.random.default_rng(3).integers(0, 255, 200 * 2**20, dtype=np.uint8)\n"
    "hashlib.sha256(held).hexdigest()"
)
DIGEST = "hashlib.sha256(held).hexdigest()"


def _run(sandbox: Sandbox, code: str) -> str:
    result = sandbox.create_code_context().run_code(code)
    assert result.error is None, result.error
    return result.text


def _storage(engine: EngineProcess, snapshot_id: str) -> str:
    return str(engine.client().request("GET", f"/snapshots/{snapshot_id}")["storage"])


def test_a_first_capture_is_listed_writing_until_its_memory_is_written(
    own_engine: EngineProcess,
) -> None:
    client = own_engine.client()
    sandbox = Sandbox.create(memory_mb=1024, client=client)
    try:
        digest = _run(sandbox, FILL)
        restored: list[str] = []
        with own_engine.holding("snapshot.writing") as parked:
            snapshot_id = sandbox.snapshot("first").id
            parked()
            assert _storage(own_engine, snapshot_id) == "writing"
            assert _run(sandbox, DIGEST) == digest  # the sandbox runs on meanwhile

            def restore() -> None:  # waits for the write, then has its data
                copy = Sandbox.create(from_snapshot=snapshot_id, client=client)
                try:
                    restored.append(_run(copy, DIGEST))
                finally:
                    copy.kill()

            restoring = threading.Thread(target=restore)
            restoring.start()
        restoring.join(600)  # a bound for a hang, not a speed
        assert restored == [digest]
        assert _storage(own_engine, snapshot_id) == "local"
        # The next capture lies over the written layer and restores too.
        _run(sandbox, "held[:1_000_000] += 1")
        later = _run(sandbox, DIGEST)
        second = sandbox.snapshot("second").id
        assert _storage(own_engine, second) == "local"  # small: written before it returned
        copy = Sandbox.create(from_snapshot=second, client=client)
        try:
            assert _run(copy, DIGEST) == later
        finally:
            copy.kill()
    finally:
        sandbox.kill()


def test_an_engine_killed_while_a_capture_is_written_drops_only_that_capture(
    own_engine: EngineProcess,
) -> None:
    sandbox = Sandbox.create(memory_mb=1024, client=own_engine.client())
    digest = _run(sandbox, FILL)
    with own_engine.holding("snapshot.writing") as parked:
        doomed = sandbox.snapshot("doomed").id
        parked()
        own_engine.stop(signal.SIGKILL)
    own_engine.start()
    client = own_engine.client()
    sandbox.client = client
    with pytest.raises(NotFoundError):
        Snapshot.get(doomed, client=client)  # it could not restore: not listed
    assert _run(sandbox, DIGEST) == digest  # the sandbox ran on through the crash
    check_engine(own_engine, {})  # every listed snapshot restores; nothing is left unowned
    _run(sandbox, "held[-1_000_000:] += 1")
    later = _run(sandbox, DIGEST)
    again = sandbox.snapshot("after the crash").id  # over the layer below the dropped one
    copy = Sandbox.create(from_snapshot=again, client=client)
    try:
        assert _run(copy, DIGEST) == later
    finally:
        copy.kill()
        sandbox.kill()
