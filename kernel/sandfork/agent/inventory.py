"""The variable inventory of a kernel's namespace, computed inside the kernel between cells.

The engine asks for it before every visible snapshot, with a silent execute request whose
``user_expressions`` call :func:`inventory` on ``get_ipython().user_ns``. Safe by construction:
a value is looked at only through its exact type — builtins, NumPy arrays and pandas frames
(found in ``sys.modules``, never imported) — so no method of a user-defined class runs (no
``len``, ``repr``, ``__sizeof__``, attribute access or pickling); anything else, subclasses
included, is listed by its type's qualified name alone. Bounded: at most ``max_variables``
entries and about 200 KiB of JSON, and no new variable is looked at once ``budget_s`` has
passed; no single value costs more than hashing a few MiB.

Fingerprints are BLAKE2b digests: ``f:`` over all of a value's content, ``s:`` over a sample
(evenly spaced blocks of a large array or string, rows and columns of a large frame), so a
change outside the sample goes unseen.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import time
from collections.abc import Iterable
from operator import itemgetter
from types import ModuleType
from typing import Any

FULL_BYTES = 4 * 2**20  # content up to this is hashed whole, above it sampled
SAMPLE_BLOCKS, SAMPLE_BLOCK = 16, 64 * 1024  # a sampled hash reads 16 blocks of 64 KiB
FRAME_ROWS, FRAME_COLUMNS = 1024, 128  # a frame's fingerprint reads at most these
MAX_DEPTH = 4  # nesting of builtin containers a fingerprint walks into
MAX_NAME = MAX_TYPE = 128  # characters; longer names are skipped, longer types shortened
MAX_OUTPUT = 200 * 1024  # characters of JSON; the listing stops before passing it

_SCALARS = frozenset({int, float, complex, bool, type(None)})
_SIZED = frozenset({str, bytes, bytearray, list, tuple, dict, set, frozenset, range})
# type's own getters: ``t.__qualname__`` would let a metaclass answer with code of its own.
_QUALNAME = type.__dict__["__qualname__"]
_MODULE = type.__dict__["__module__"]


def inventory(
    namespace: dict[str, Any],
    hidden: dict[str, Any] | None = None,
    budget_s: float = 0.2,
    max_variables: int = 500,
) -> str:
    """The inventory of ``namespace`` as JSON text (``{"status", "reason", "truncated",
    "elapsed_ms", "variables": [{"name", "type", "shape", "length", "bytes",
    "fingerprint"}]}``, variables sorted by name); ``truncated`` when the time, count or size
    bound cut it short. Names starting with ``_``, modules and what IPython put there itself
    (``hidden``: its ``user_ns_hidden``, a name still bound to the same object, as ``%who``
    has it) are left out."""
    started = time.monotonic()
    own = hidden if type(hidden) is dict else {}
    try:
        budget = _Budget(started + budget_s)
        variables, truncated = _listing(namespace, own, budget, max_variables)
        status, reason = "ok", None
    except Exception as e:  # never the kernel's problem: the engine stores it as unavailable
        variables, truncated = [], False
        status, reason = "unavailable", f"the inventory failed: {_type_name(type(e))}"
    elapsed_ms = int((time.monotonic() - started) * 1000)
    return json.dumps(
        {
            "status": status,
            "reason": reason,
            "truncated": truncated,
            "elapsed_ms": elapsed_ms,
            "variables": variables,
        }
    )


class _Budget:
    """The deadline of one inventory; ``hit`` once it has passed."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.hit = False

    def left(self) -> bool:
        if time.monotonic() > self.deadline:
            self.hit = True
        return not self.hit


def _listing(
    namespace: dict[str, Any], hidden: dict[str, Any], budget: _Budget, max_variables: int
) -> tuple[list[dict[str, Any]], bool]:
    items = list(namespace.items())  # one step: a thread may change the namespace meanwhile
    candidates = [
        (name, value)
        for name, value in items
        if type(name) is str
        and name
        and not name.startswith("_")
        and not (name in hidden and hidden[name] is value)
        and not issubclass(type(value), ModuleType)
    ]
    truncated = any(len(name) > MAX_NAME for name, _ in candidates)
    candidates = sorted(((n, v) for n, v in candidates if len(n) <= MAX_NAME), key=itemgetter(0))
    variables: list[dict[str, Any]] = []
    size = 0
    for name, value in candidates:
        if len(variables) == max_variables or not budget.left():
            return variables, True
        entry = _describe(name, value, budget)
        size += len(json.dumps(entry)) + 2
        if size > MAX_OUTPUT:
            return variables, True
        variables.append(entry)
    return variables, truncated or budget.hit


def _describe(name: str, value: Any, budget: _Budget) -> dict[str, Any]:
    t = type(value)
    entry: dict[str, Any] = {
        "name": name,
        "type": _type_name(t),
        "shape": None,
        "length": None,
        "bytes": None,
        "fingerprint": None,
    }
    try:
        if t in _SCALARS or t in _SIZED:
            entry["bytes"] = sys.getsizeof(value)
            entry["fingerprint"] = _builtin_fingerprint(value)
            if t in _SIZED:
                entry["length"] = len(value)
        elif t is _library_type("numpy", "ndarray"):
            entry["shape"] = [int(n) for n in value.shape]
            entry["bytes"] = int(value.nbytes)
            entry["fingerprint"] = _array_fingerprint(value)
        elif t is _library_type("pandas", "DataFrame"):
            entry["shape"] = [int(n) for n in value.shape]
            entry["bytes"] = int(value.memory_usage(deep=False).sum())
            entry["fingerprint"] = _frame_fingerprint(value, budget)
        elif t is _library_type("pandas", "Series"):
            entry["shape"] = [len(value)]
            entry["bytes"] = int(value.memory_usage(deep=False))
            entry["fingerprint"] = _frame_fingerprint(value, budget)
    except Exception:  # e.g. a range too long for len(): what was measured stays
        pass
    return entry


def _library_type(module: str, name: str) -> type | None:
    """The class ``module.name`` if that library is loaded (it is never imported here)."""
    mod = sys.modules.get(module)
    if type(mod) is not ModuleType:
        return None
    found = mod.__dict__.get(name)
    return found if issubclass(type(found), type) else None


def _type_name(t: type) -> str:
    """``int``, ``numpy.ndarray``, ``pandas.DataFrame``, ``mymodule.Outer.Inner``: a class's
    qualified name, shortened to its package's when the package exports it by that name."""
    qualname, module = _QUALNAME.__get__(t), _MODULE.__get__(t)
    if type(module) is not str:
        module = "?"
    if module == "builtins":
        name = qualname
    else:
        package = module.partition(".")[0]
        top = sys.modules.get(package)
        if type(top) is ModuleType and top.__dict__.get(qualname) is t:
            module = package
        name = f"{module}.{qualname}"
    return name if len(name) <= MAX_TYPE else name[: MAX_TYPE - 1] + "…"


# -- fingerprints ---------------------------------------------------------------------------


def _hash() -> Any:
    return hashlib.blake2b(digest_size=16)


def _spread(count: int, most: int) -> Any:
    """``most`` evenly spaced positions in ``range(count)`` (all of them if there are fewer),
    as a NumPy index array."""
    np = sys.modules["numpy"]
    if count <= most:
        return np.arange(count, dtype=np.intp)
    return np.arange(most, dtype=np.intp) * (count - 1) // (most - 1)


def _block_starts(length: int, block: int) -> Iterable[int]:
    return (i * (length - block) // (SAMPLE_BLOCKS - 1) for i in range(SAMPLE_BLOCKS))


def _builtin_fingerprint(value: Any) -> str | None:
    t = type(value)
    h = _hash()
    if t is str and len(value) > FULL_BYTES // 4:
        h.update(b"s%d" % len(value))
        chars = SAMPLE_BLOCK // 4
        for start in _block_starts(len(value), chars):
            h.update(value[start : start + chars].encode("utf-8", "surrogatepass"))
        return "s:" + h.hexdigest()
    if (t is bytes or t is bytearray) and len(value) > FULL_BYTES:
        h.update(b"y%d" % len(value))
        view = memoryview(value)
        for start in _block_starts(len(value), SAMPLE_BLOCK):
            h.update(view[start : start + SAMPLE_BLOCK])
        return "s:" + h.hexdigest()
    return "f:" + h.hexdigest() if _feed(h, value, [FULL_BYTES], MAX_DEPTH) else None


def _tagged(h: Any, tag: bytes, data: bytes) -> None:
    h.update(tag + len(data).to_bytes(8, "little"))
    h.update(data)


def _feed(h: Any, value: Any, allowance: list[int], depth: int) -> bool:
    """Add a builtin value (containers of builtins included) to ``h``; False, with part of it
    added, for anything else or past the allowance of bytes and nesting."""
    t = type(value)
    allowance[0] -= 16
    if allowance[0] < 0 or depth < 0:
        return False
    if t is bool:
        h.update(b"b1" if value else b"b0")
    elif t is int:
        if value.bit_length() > 8 * 1024 * 8:
            return False
        _tagged(h, b"i", value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True))
    elif t is float:
        h.update(b"f" + struct.pack("<d", value))
    elif t is complex:
        h.update(b"c" + struct.pack("<dd", value.real, value.imag))
    elif value is None:
        h.update(b"n")
    elif t is str or t is bytes or t is bytearray:
        if len(value) > allowance[0]:
            return False
        data = value.encode("utf-8", "surrogatepass") if t is str else value
        allowance[0] -= len(data)
        _tagged(h, {str: b"s", bytes: b"y", bytearray: b"Y"}[t], data)
    elif t is list or t is tuple:
        h.update((b"l" if t is list else b"t") + len(value).to_bytes(8, "little"))
        return all(_feed(h, item, allowance, depth - 1) for item in value)
    elif t is dict:
        h.update(b"d" + len(value).to_bytes(8, "little"))
        return all(
            _feed(h, k, allowance, depth - 1) and _feed(h, v, allowance, depth - 1)
            for k, v in value.items()
        )
    elif t is set or t is frozenset:
        digests = []  # sorted: equal sets may iterate in different orders
        for item in value:
            part = _hash()
            if not _feed(part, item, allowance, depth - 1):
                return False
            digests.append(part.digest())
        h.update((b"S" if t is set else b"F") + len(value).to_bytes(8, "little"))
        h.update(b"".join(sorted(digests)))
    else:
        return False
    return True


def _array_fingerprint(array: Any) -> str | None:
    np = sys.modules["numpy"]
    if array.dtype.hasobject:  # its bytes are pointers
        return None
    h = _hash()
    h.update(f"{array.dtype}|{array.shape}|".encode())
    if array.nbytes <= FULL_BYTES:
        h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        return "f:" + h.hexdigest()
    if array.flags.c_contiguous:
        data = array.reshape(-1).view(np.uint8)
        for start in _block_starts(len(data), SAMPLE_BLOCK):
            h.update(data[start : start + SAMPLE_BLOCK])
    else:  # evenly spaced elements, as many as the blocks hold
        count = SAMPLE_BLOCKS * SAMPLE_BLOCK // max(array.itemsize, 1)
        picked = array.flat[_spread(array.size, count)]
        h.update(np.ascontiguousarray(picked).view(np.uint8))
    return "s:" + h.hexdigest()


def _frame_fingerprint(frame: Any, budget: _Budget) -> str | None:
    """A DataFrame's (or Series') column labels, dtypes and sampled values; None when the
    time budget ran out before every sampled column was read."""
    h = _hash()
    h.update(f"{frame.shape}|".encode())
    rows = _spread(frame.shape[0], FRAME_ROWS)
    complete = frame.shape[0] <= FRAME_ROWS
    columns: Iterable[tuple[Any, Any]]
    if frame.ndim == 1:
        columns = [(frame.name, frame)]
    else:
        picked = _spread(frame.shape[1], FRAME_COLUMNS)
        complete = complete and len(picked) == frame.shape[1]
        columns = ((frame.columns[i], frame.iloc[:, i]) for i in picked.tolist())
    allowance = [FULL_BYTES]
    for label, column in columns:
        if not budget.left():
            return None
        complete = _feed_or_name(h, label, allowance) and complete
        complete = _feed_column(h, column, rows, allowance) and complete
    return ("f:" if complete else "s:") + h.hexdigest()


def _feed_or_name(h: Any, value: Any, allowance: list[int]) -> bool:
    """Add a builtin value to ``h``, or else its type's name (and say so: False)."""
    if _feed(h, value, allowance, 1):
        return True
    h.update(_type_name(type(value)).encode())
    return False


def _feed_column(h: Any, column: Any, rows: Any, allowance: list[int]) -> bool:
    np = sys.modules["numpy"]
    values = column.array  # pandas' own array over the column, not a copy
    kind = _type_name(type(values))
    h.update(kind.encode())
    if not kind.startswith("pandas."):  # a third-party extension array: not read
        return False
    h.update(f"{column.dtype}|".encode())
    sample = np.asarray(values[rows])
    if not sample.dtype.hasobject:
        h.update(np.ascontiguousarray(sample).reshape(-1).view(np.uint8))
        return True
    complete = True
    for item in sample.tolist():
        complete = _feed_or_name(h, item, allowance) and complete
    return complete
