"""The variable inventory captured with every snapshot: the guest's function, run in-process
here, the engine's check of what a guest sends, the SDK's diff, and snapshots of real VMs
(a busy kernel, a hostile one)."""

from __future__ import annotations

import base64
import json
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
import requests

from conftest import EngineProcess
from sandfork.agent import inventory as guest
from sandfork.engine import inventory as engine_inventory
from sandfork.sdk import Client, Inventory, Sandbox, Snapshot, Variable, diff

# -- the guest's inventory, in-process --------------------------------------------------------


pytestmark = pytest.mark.any_backend  # above the backend: runs once (on containers where they run)


def listed(namespace: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """The inventory of ``namespace``, checked as the engine checks a guest's."""
    return engine_inventory.check(json.loads(guest.inventory(namespace, **kwargs)))


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in doc["variables"]}


def test_inventory_describes_builtins_arrays_and_frames() -> None:
    frame = pd.DataFrame({"a": range(1000), "b": ["x"] * 1000})
    namespace = {
        "n": 7,
        "text": "hello",
        "data": b"abc",
        "items": [1, [2, "x"], {"k": 3.0}],
        "grid": np.zeros((20, 30)),
        "df": frame,
        "series": frame["a"],
        "f": lambda: 0,
        "np": np,  # a module: left out
        "_hidden": 1,
        "In": [],
        "Out": {},
        "get_ipython": print,
        "open": open,
    }
    # IPython's own names (user_ns_hidden) are left out while they are still its objects.
    hidden = {name: namespace[name] for name in ("In", "Out", "get_ipython", "open")}
    hidden["text"] = "another object"  # a user's own binding of a name IPython had
    doc = listed(namespace, hidden=hidden)
    assert doc["status"] == "ok" and doc["truncated"] is False
    assert [v["name"] for v in doc["variables"]] == sorted(
        ["n", "text", "data", "items", "grid", "df", "series", "f"]
    )
    found = by_name(doc)
    assert found["n"]["type"] == "int" and found["n"]["fingerprint"].startswith("f:")
    assert (found["text"]["type"], found["text"]["length"]) == ("str", 5)
    assert (found["data"]["type"], found["data"]["length"]) == ("bytes", 3)
    assert found["items"]["length"] == 3 and found["items"]["fingerprint"] is not None
    assert found["grid"] == found["grid"] | {
        "type": "numpy.ndarray",
        "shape": [20, 30],
        "bytes": 20 * 30 * 8,
        "length": None,
    }
    assert found["df"]["type"] == "pandas.DataFrame" and found["df"]["shape"] == [1000, 2]
    assert found["df"]["bytes"] == int(frame.memory_usage(deep=False).sum())
    assert found["series"]["type"] == "pandas.Series" and found["series"]["shape"] == [1000]
    assert found["f"] == found["f"] | {"type": "function", "fingerprint": None}


class Recorder:
    """Records every call of the methods an inventory must never call."""

    calls: list[str] = []  # noqa: RUF012 (shared on purpose: one list for all instances)

    def __len__(self) -> int:
        Recorder.calls.append("__len__")
        return 1

    def __getattr__(self, name: str) -> Any:
        Recorder.calls.append(f"__getattr__({name})")
        raise AttributeError(name)

    def __sizeof__(self) -> int:
        Recorder.calls.append("__sizeof__")
        return 1

    def __reduce__(self) -> Any:
        Recorder.calls.append("__reduce__")
        return (Recorder, ())

    def __reduce_ex__(self, protocol: Any) -> Any:
        Recorder.calls.append("__reduce_ex__")
        return (Recorder, ())

    def __repr__(self) -> str:
        Recorder.calls.append("__repr__")
        return "Recorder()"

    def __iter__(self) -> Iterator[int]:
        Recorder.calls.append("__iter__")
        return iter([1])

    def __eq__(self, other: object) -> bool:
        Recorder.calls.append("__eq__")
        return self is other

    def __hash__(self) -> int:
        Recorder.calls.append("__hash__")
        return 1

    @property
    def shape(self) -> tuple[int, ...]:
        Recorder.calls.append("shape")
        return (1,)

    @property
    def __class__(self) -> type:  # type: ignore[override]
        Recorder.calls.append("__class__")
        return list


class RecordingList(list[int]):
    """A builtin's subclass: listed by its name only."""

    def __len__(self) -> int:
        Recorder.calls.append("RecordingList.__len__")
        return 0

    def __getattribute__(self, name: str) -> Any:
        Recorder.calls.append(f"RecordingList.{name}")
        return super().__getattribute__(name)


class RecordingFrame(pd.DataFrame):
    """A pandas subclass: listed by its name only."""

    @property
    def shape(self) -> tuple[int, int]:
        Recorder.calls.append("RecordingFrame.shape")
        return (0, 0)


def test_inventory_never_runs_user_code() -> None:
    namespace = {
        "rec": Recorder(),
        "in_list": [Recorder(), 1],
        "in_dict": {"k": Recorder()},
        "in_set": {Recorder()},
        "sub": RecordingList([1, 2]),
        "frame_sub": RecordingFrame({"a": [1]}),
        "objects": pd.DataFrame({"a": [Recorder(), Recorder()]}),
        "labelled": pd.Series([1, 2], name=Recorder()),
        "object_array": np.array([Recorder(), Recorder()], dtype=object),
    }
    Recorder.calls.clear()
    found = by_name(listed(namespace))
    assert Recorder.calls == []
    assert found["rec"] == found["rec"] | {
        "type": "test_inventory.Recorder",
        "length": None,
        "bytes": None,
        "fingerprint": None,
    }
    assert found["sub"]["type"] == "test_inventory.RecordingList" and found["sub"]["length"] is None
    assert found["frame_sub"]["type"] == "test_inventory.RecordingFrame"
    assert found["frame_sub"]["shape"] is None
    assert found["in_list"]["length"] == 2 and found["in_list"]["fingerprint"] is None
    assert found["objects"]["shape"] == [2, 1]
    assert found["objects"]["fingerprint"].startswith("s:")  # its values could not be read
    assert found["object_array"]["fingerprint"] is None


def test_inventory_stops_at_its_count_and_time_bounds() -> None:
    namespace = {f"v{i:02d}": i for i in range(20)}
    doc = listed(namespace, max_variables=5)
    assert [v["name"] for v in doc["variables"]] == ["v00", "v01", "v02", "v03", "v04"]
    assert doc["truncated"] is True
    assert listed(namespace, budget_s=0.0) | {"elapsed_ms": 0} == {
        "status": "ok",
        "reason": None,
        "truncated": True,
        "elapsed_ms": 0,
        "variables": [],
    }
    # The budget is time: a clock that moves 10 ms at each look makes it deterministic.
    arrays = {f"a{i:03d}": np.full(2**10, i, dtype=np.float64) for i in range(200)}
    ticks = iter(range(10**6))
    clock = types.SimpleNamespace(monotonic=lambda: next(ticks) / 100)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(guest, "time", clock)
        doc = listed(arrays, budget_s=0.05)
    assert doc["truncated"] is True and 0 < len(doc["variables"]) < 10
    assert listed({"x" * 129: 1, "y": 2})["truncated"] is True  # a name too long is left out


def fingerprint(value: Any) -> str:
    found = listed({"v": value})["variables"][0]["fingerprint"]
    assert isinstance(found, str)
    return found


def test_fingerprints_follow_content_full_or_sampled() -> None:
    small = np.arange(1000, dtype=np.float64)
    assert fingerprint(small).startswith("f:")
    assert fingerprint(small) == fingerprint(small.copy())
    changed = small.copy()
    changed[500] = -1
    assert fingerprint(changed) != fingerprint(small)
    assert fingerprint(small.astype(np.float32)) != fingerprint(small)  # dtype counts
    assert fingerprint(small.reshape(10, 100)) != fingerprint(small)  # so does shape

    large = np.zeros(2**20, dtype=np.float64)  # 8 MiB: sampled
    assert fingerprint(large).startswith("s:")
    edited = large.copy()
    edited[0] = 1  # the first block is always read
    assert fingerprint(edited) != fingerprint(large)
    assert fingerprint(edited) == fingerprint(edited.copy())

    strided = np.zeros((2048, 1024))[:, ::2]  # not contiguous, 8 MiB: sampled elements
    assert fingerprint(strided).startswith("s:")
    moved = strided.copy()
    moved[0, 0] = 1
    assert fingerprint(moved) != fingerprint(strided)
    assert fingerprint(np.arange(12.0).reshape(3, 4).T) == fingerprint(
        np.ascontiguousarray(np.arange(12.0).reshape(3, 4).T)
    )

    frame = pd.DataFrame({"a": range(100), "b": [f"s{i}" for i in range(100)]})
    assert fingerprint(frame).startswith("f:") and fingerprint(frame) == fingerprint(frame.copy())
    other = frame.copy()
    other.loc[3, "b"] = "changed"
    assert fingerprint(other) != fingerprint(frame)
    assert fingerprint(frame.rename(columns={"a": "c"})) != fingerprint(frame)
    tall = pd.DataFrame({"a": np.arange(100_000)})
    assert fingerprint(tall).startswith("s:")

    assert fingerprint("x" * 10) != fingerprint("x" * 11)
    assert fingerprint({1, 2, 3}) == fingerprint({3, 2, 1})
    long_text = "ab" * 2**20
    assert fingerprint(long_text).startswith("s:")
    assert fingerprint("b" + long_text[1:]) != fingerprint(long_text)


def test_a_failing_inventory_is_unavailable_not_an_exception() -> None:
    doc = json.loads(guest.inventory(None))  # type: ignore[arg-type]
    assert doc["status"] == "unavailable" and "AttributeError" in doc["reason"]


# -- the engine's check of what the guest sends ---------------------------------------------


def reply(text: str) -> dict[str, Any]:
    """user_expressions as ipykernel sends them for a str value (IPython's repr of it)."""
    encoded = base64.b64encode(text.encode()).decode()
    return {"inventory": {"status": "ok", "data": {"text/plain": repr(encoded)}, "metadata": {}}}


def refusal(user_expressions: Any) -> str:
    with pytest.raises(ValueError) as e:
        engine_inventory.parse(user_expressions)
    return str(e.value)


GOOD = {
    "status": "ok",
    "reason": None,
    "truncated": False,
    "elapsed_ms": 3,
    "variables": [
        {
            "name": "a",
            "type": "int",
            "shape": None,
            "length": None,
            "bytes": 28,
            "fingerprint": None,
        }
    ],
}


def test_the_engine_accepts_only_an_inventory_of_the_exact_schema() -> None:
    assert engine_inventory.parse(reply(json.dumps(GOOD))) == GOOD
    a = GOOD["variables"][0]  # type: ignore[index]
    wrong: list[tuple[Any, str]] = [
        ({**GOOD, "extra": 1}, "unknown fields"),
        ({**GOOD, "status": "fine"}, "status"),
        ({**GOOD, "truncated": 1}, "truncated"),
        ({**GOOD, "elapsed_ms": -1}, "elapsed_ms"),
        ({**GOOD, "variables": [a, a]}, "sorted"),
        ({**GOOD, "variables": [{**a, "name": "b"}, a]}, "sorted"),
        ({**GOOD, "variables": [{**a, "name": "x" * 300}]}, "name"),
        ({**GOOD, "variables": [{**a, "bytes": 2**64}]}, "bytes"),
        ({**GOOD, "variables": [{**a, "bytes": 1.5}]}, "bytes"),
        ({**GOOD, "variables": [{**a, "shape": [1] * 65}]}, "shape"),
        ({**GOOD, "variables": [{**a, "fingerprint": "<script>"}]}, "fingerprint"),
        ({**GOOD, "variables": [{"name": "a"}]}, "missing"),
        ({**GOOD, "variables": [a] * 501}, "at most 500"),
        ([1, 2], "must be an object"),
    ]
    for doc, words in wrong:
        reason = refusal(reply(json.dumps(doc)))
        assert "does not match its schema" in reason and words in reason, reason
    assert "larger than 256 KiB" in refusal(reply("x" * 300_000))
    assert "not valid JSON" in refusal(reply("{not json"))
    assert "not valid JSON" in refusal(reply("[" * 100_000))
    assert "not valid JSON" in refusal(reply(json.dumps(GOOD).replace("3", "NaN")))
    plain = {"inventory": {"status": "ok", "data": {"text/plain": "'{}'"}, "metadata": {}}}
    assert "not return base64" in refusal(plain)
    assert "no inventory" in refusal({})
    assert "no inventory" in refusal(None)
    failed = {"inventory": {"status": "error", "ename": "NameError", "evalue": "x" * 10_000}}
    reason = refusal(failed)
    assert reason.startswith("the inventory failed in the kernel: NameError: ")
    assert len(reason) < 300


# -- the SDK's diff -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"x" * (256 * 1024 + 1), "larger than 256 KiB"),
        (b"\xff{", "not valid JSON"),
        (b'{"status": "ok", "variables": 5}', "unknown fields"),
        (b"[" * 100_000, "not valid JSON"),
        (b'{"status": NaN}', "not valid JSON"),
    ],
)
def test_an_imported_inventory_is_checked_like_a_guests(raw: bytes, why: str) -> None:
    """An archive is untrusted: what it carries as inventory.json is stored only if valid."""
    stored = json.loads(engine_inventory.sanitized(raw))
    assert stored["status"] == "unavailable" and stored["variables"] == []
    assert (
        stored["reason"].startswith("the imported inventory was refused")
        and why in stored["reason"]
    )


def test_a_valid_imported_inventory_is_kept() -> None:
    doc = listed({"n": 1, "text": "hello"})
    assert json.loads(engine_inventory.sanitized(json.dumps(doc).encode())) == doc


def variable(name: str, **fields: Any) -> Variable:
    return Variable(name=name, **{"type": "int", **fields})


def test_diff_names_added_removed_changed_and_unchanged() -> None:
    before = Inventory(
        "ok",
        variables=(
            variable("gone"),
            variable("same", fingerprint="f:" + "0" * 32),
            variable("refilled", shape=(2, 2), fingerprint="f:" + "1" * 32),
            variable("resized", length=3),
            variable("retyped"),
            variable("unhashed", bytes=28),
        ),
    )
    after = Inventory(
        "ok",
        variables=(
            variable("new"),
            variable("same", fingerprint="f:" + "0" * 32),
            variable("refilled", shape=(2, 2), fingerprint="f:" + "2" * 32),
            variable("resized", length=4),
            variable("retyped", type="str"),
            variable("unhashed", bytes=28, fingerprint="f:" + "3" * 32),
        ),
    )
    d = diff(before, after, "snap_a", "snap_b")
    assert [v.name for v in d.added] == ["new"]
    assert [v.name for v in d.removed] == ["gone"]
    assert [c.name for c in d.changed] == ["refilled", "resized", "retyped"]
    assert d.unchanged == ("same", "unhashed")  # a missing fingerprint is not a change
    api = d.to_api()
    assert set(api) == {"from", "to", "added", "removed", "changed", "unchanged"}
    assert (api["from"], api["to"]) == ("snap_a", "snap_b")
    assert api["changed"][0]["before"]["shape"] == [2, 2]
    assert api["changed"][0]["after"]["fingerprint"] == "f:" + "2" * 32
    assert Inventory.from_api(before.to_api()) == before
    assert diff(after, after, "x", "x").changed == ()


class NoClient:
    """Fails any request: a snapshot without an inventory needs none."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"unexpected request {args}")


def test_a_snapshot_from_before_inventories_reads_as_unavailable() -> None:
    fields = {"id": "snap_" + "0" * 16, "name": None, "created_at": "2024-01-01T00:00:00Z"}
    fields |= {"sandbox_id": "sbx_" + "0" * 16, "template": "t", "parent_id": None}
    old = Snapshot(**fields, size_bytes=1, client=NoClient())  # type: ignore[arg-type]
    inv = old.inventory()
    assert inv.status == "unavailable" and inv.reason is not None and "before" in inv.reason
    d = old.diff(old)
    assert (d.from_id, d.added, d.removed, d.changed) == (old.id, (), (), ())


# -- snapshots of real VMs ------------------------------------------------------------------


def inventory_of(client: Client, snapshot_id: str) -> Inventory:
    return Snapshot.get(snapshot_id, client=client).inventory()


# Run in a guest kernel: its inventories get all the time they need. The time budget is a
# bound for slow machines (checked above with a clock the test moves); what an inventory
# says of the variables must not depend on how loaded the machine running the test is.
NO_TIME_BUDGET = (
    "import functools as _f, sandfork_agent.inventory as _i\n"
    "_i.inventory = _f.partial(_i.inventory, budget_s=3600.0)\n"
    "del _f, _i\n"
)


@pytest.mark.vm
def test_a_snapshot_carries_its_inventory_and_two_compare(
    client: Client, engine: EngineProcess
) -> None:
    sb = Sandbox.create(client=client)
    try:
        ctx = sb.create_code_context()
        setup = ctx.run_code(
            NO_TIME_BUDGET + "import numpy as np, pandas as pd\n"
            "df = pd.DataFrame({'a': range(1000), 'b': ['x'] * 1000})\n"
            "grid = np.zeros((100, 3))\n"
            "n = 1"
        )
        assert setup.error is None, setup.error
        before = ctx.run_code("len(In)")
        first = sb.snapshot().id
        after = ctx.run_code("len(In)")
        # The inventory is silent: no execution count, no history.
        assert after.execution_count == before.execution_count + 1  # type: ignore[operator]
        assert int(after.text or 0) == int(before.text or 0) + 1
        inv = inventory_of(client, first)
        assert inv.status == "ok", inv.reason
        df = inv.get("df")
        assert df is not None and (df.type, df.shape) == ("pandas.DataFrame", (1000, 2))
        assert inv.get("grid") == Variable(
            "grid",
            "numpy.ndarray",
            (100, 3),
            None,
            2400,
            inv.get("grid").fingerprint,  # type: ignore[union-attr]
        )
        assert inv.get("np") is None and inv.get("In") is None and inv.get("open") is None
        raw = engine.get(f"/v1/snapshots/{first}/attachments/inventory.json")
        assert raw.status_code == 200 and raw.json()["status"] == "ok"

        ctx.run_code("df.loc[5, 'a'] = -5\nm = 2\ndel n")
        second = sb.snapshot().id
        d = Snapshot.get(first, client=client).diff(Snapshot.get(second, client=client))
        assert [c.name for c in d.changed] == ["df"]
        assert [v.name for v in d.added] == ["m"] and [v.name for v in d.removed] == ["n"]
        assert "grid" in d.unchanged

        refused = requests.post(
            f"{engine.url}/v1/sandboxes/{sb.id}/snapshots",
            json={"attachments": {"inventory.json": "{}"}},
            headers=engine.auth,
            timeout=60,
        )
        assert refused.status_code == 400 and "reserved" in refused.json()["error"]
    finally:
        sb.kill()


@pytest.mark.vm
def test_a_busy_kernel_does_not_hold_the_snapshot_up(client: Client) -> None:
    sb = Sandbox.create(client=client)
    try:
        ctx = sb.create_code_context()
        ctx.run_code("x = 1")
        outcome: dict[str, Any] = {}
        # The cell runs until the test lets it end, after the snapshot: a snapshot that
        # waited for it would never return.
        cell_code = (
            "import os, time\n"
            "open('/tmp/cell-started', 'w').close()\n"
            "while not os.path.exists('/tmp/cell-may-end'): time.sleep(0.05)\n"
            "'done'"
        )
        cell = threading.Thread(target=lambda: outcome.update(run=ctx.run_code(cell_code)))
        cell.start()
        while sb.exec("test -e /tmp/cell-started").exit_code != 0:  # the cell is running
            assert cell.is_alive(), outcome
        busy = sb.snapshot().id
        assert cell.is_alive() and not outcome  # the snapshot came while the cell ran on
        inv = inventory_of(client, busy)
        assert inv.status == "unavailable" and inv.variables == ()
        assert inv.reason is not None and inv.reason.startswith("the kernel was busy"), inv.reason
        sb.exec("touch /tmp/cell-may-end")
        cell.join(600)
        # The cell was not interrupted, and the late answer disturbed nothing.
        assert outcome["run"].error is None and outcome["run"].text == "'done'"
        count = outcome["run"].execution_count
        assert ctx.run_code("1").execution_count == count + 1
        assert inventory_of(client, sb.snapshot()).status == "ok"
    finally:
        sb.kill()


HOSTILE = """
import json, sys, time, types
fake = types.ModuleType("sandfork_agent.inventory")
sys.modules["sandfork_agent.inventory"] = fake
"""


@pytest.mark.vm
def test_a_hostile_kernel_gets_an_unavailable_inventory(client: Client) -> None:
    sb = Sandbox.create(client=client)
    try:
        ctx = sb.create_code_context()
        assert ctx.run_code(HOSTILE).error is None
        cases = [
            ("lambda ns, hidden: 'x' * 10_000_000", "larger than 256 KiB"),
            ("lambda ns, hidden: '{not json'", "not valid JSON"),
            ("lambda ns, hidden: json.dumps({'status': 'ok', 'variables': 5})", "match its schema"),
            ("lambda ns, hidden: 42", "failed in the kernel: AttributeError"),
            ("lambda ns, hidden: 1 / 0", "failed in the kernel: ZeroDivisionError"),
            # Last: it stays busy for longer than any test (a snapshot waiting would hang).
            ("lambda ns, hidden: time.sleep(3000)", "the kernel was busy"),
        ]
        for function, reason in cases:
            assert ctx.run_code(f"fake.inventory = {function}").error is None
            inv = inventory_of(client, sb.snapshot())
            assert inv.status == "unavailable", (function, inv)
            assert inv.reason is not None and reason in inv.reason, (function, inv.reason)
    finally:
        sb.kill()


def test_a_gigabyte_array_is_described_from_samples() -> None:
    """A 1 GiB array and a million-row frame get their shape, size and a fingerprint of
    samples (``s:``), never a read of everything. How long it takes in a guest under TCG is
    ``benchmarks/bench_inventory.py``'s; here the budget cannot run out."""
    namespace = {
        "big": np.zeros(2**27),  # 1 GiB of untouched pages: only the samples are read
        "frame": pd.DataFrame({"a": np.arange(1_000_000), "b": np.ones(1_000_000)}),
    }
    doc = listed(namespace, budget_s=3600)
    assert doc["status"] == "ok" and not doc["truncated"], doc
    big, frame = by_name(doc)["big"], by_name(doc)["frame"]
    assert big["shape"] == [2**27] and big["bytes"] == 2**30
    assert big["fingerprint"].startswith("s:")
    assert frame["shape"] == [1_000_000, 2] and frame["fingerprint"].startswith("s:")
