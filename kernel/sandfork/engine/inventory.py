"""The variable inventory stored with every visible snapshot: the attachment ``inventory.json``.

Taken just before the capture, the sandbox's lock held, from the default code context's
kernel: a silent execute request (no history, no execution count) whose ``user_expressions``
run :func:`sandfork.agent.inventory.inventory` on the user's namespace. The wait is bounded
(``EngineConfig.inventory_timeout``): a kernel busy with a cell is not interrupted, the
snapshot goes on with an inventory marked unavailable, and the kernel's late reply is dropped.

The guest is untrusted: what comes back is checked against the exact schema, within
:data:`MAX_BYTES`, strings and numbers bounded, and anything else is stored as unavailable
with the reason. A failed inventory never fails the snapshot.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from typing import Any

from sandfork.engine.errors import BadRequest
from sandfork.engine.live import Live
from sandfork.protocol import DEFAULT_CONTEXT, INVENTORY_ATTACHMENT

MAX_BYTES = 256 * 1024  # of the inventory's JSON text
MAX_VARIABLES = 500
MAX_TEXT = 256  # characters of a name or a type
MAX_REASON = 1000
MAX_INT = 2**63 - 1
MAX_DIMENSIONS = 64

# The agent package is ``sandfork_agent`` in the guest. IPython answers with the value's repr;
# the repr of base64 text is the text in quotes, nothing to unescape. Text past the limit is
# cut in the kernel (one byte over, enough to refuse it): megabytes would not cross in time.
EXPRESSION = (
    "__import__('base64').b64encode(__import__('sandfork_agent.inventory', fromlist=['_'])"
    ".inventory(get_ipython().user_ns, get_ipython().user_ns_hidden)"
    f".encode()[:{MAX_BYTES + 1}]).decode()"
)
_BASE64_REPR = re.compile(r"'([A-Za-z0-9+/]*={0,2})'")
_FINGERPRINT = re.compile(r"[fs]:[0-9a-f]{32}")
_TOP_FIELDS = {"status", "reason", "truncated", "elapsed_ms", "variables"}
_VARIABLE_FIELDS = {"name", "type", "shape", "length", "bytes", "fingerprint"}


def refuse_client_inventory(attachments: dict[str, bytes] | None) -> None:
    """A 400 for a client's attachment named ``inventory.json``: that name is the engine's."""
    if attachments and INVENTORY_ATTACHMENT in attachments:
        raise BadRequest(
            f"the attachment name {INVENTORY_ATTACHMENT!r} is reserved: the engine stores the "
            "snapshot's variable inventory under it"
        )


async def take(live: Live, contexts: list[dict[str, Any]], timeout: float) -> bytes:
    """The inventory of the sandbox's default context, as the attachment's bytes.

    Never raises (cancellation aside): whatever goes wrong becomes an unavailable inventory
    saying why. ``contexts`` are the sandbox's code contexts as the agent lists them.
    """
    started = time.monotonic()
    try:
        found = parse(await _ask(live, contexts, timeout))
    except ValueError as e:
        found = unavailable(str(e), int((time.monotonic() - started) * 1000))
    return json.dumps(found).encode()


async def _ask(live: Live, contexts: list[dict[str, Any]], timeout: float) -> Any:
    """The default kernel's ``user_expressions`` for :data:`EXPRESSION`, or a ValueError."""
    running = [c for c in contexts if c.get("id") == DEFAULT_CONTEXT]
    if not running or running[0].get("status") != "running":
        # Asking would start a kernel, and the snapshot would wait for it.
        raise ValueError("the default code context's kernel is not running")
    try:
        return await live.runner.evaluate(DEFAULT_CONTEXT, {"inventory": EXPRESSION}, timeout)
    except TimeoutError:
        raise ValueError(
            f"the kernel was busy (a cell still running?) and did not answer within {timeout:g} s"
        ) from None
    except Exception as e:
        raise ValueError(f"the kernel could not be asked: {e}") from None


def unavailable(reason: str, elapsed_ms: int = 0) -> dict[str, Any]:
    """An inventory that could not be taken, and why."""
    return {
        "status": "unavailable",
        "reason": reason,
        "truncated": False,
        "elapsed_ms": elapsed_ms,
        "variables": [],
    }


def parse(user_expressions: Any) -> dict[str, Any]:
    """The inventory in a kernel's ``user_expressions``, checked; a :class:`ValueError` with
    the reason for anything else."""
    answer = _field(user_expressions, "inventory", dict, "the kernel sent no inventory")
    if answer.get("status") == "error":
        name = _clip(answer.get("ename"))
        value = _clip(answer.get("evalue"))
        raise ValueError(f"the inventory failed in the kernel: {name}: {value}")
    data = _field(answer, "data", dict, "the kernel's answer has no data")
    text = _field(data, "text/plain", str, "the kernel's answer has no text")
    if len(text) > (MAX_BYTES + 2) * 4 // 3 + 8:
        raise ValueError(f"the inventory is larger than {MAX_BYTES // 1024} KiB")
    match = _BASE64_REPR.fullmatch(text)
    if match is None:
        raise ValueError("the inventory expression did not return base64 text")
    try:
        raw = base64.b64decode(match.group(1), validate=True)
    except binascii.Error:
        raise ValueError("the inventory expression did not return base64 text") from None
    if len(raw) > MAX_BYTES:
        raise ValueError(f"the inventory is larger than {MAX_BYTES // 1024} KiB")
    try:
        doc = json.loads(raw.decode(), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise ValueError("the inventory is not valid JSON") from None
    try:
        return check(doc)
    except ValueError as e:
        raise ValueError(f"the inventory does not match its schema: {e}") from None


def sanitized(raw: bytes) -> bytes:
    """An imported snapshot's ``inventory.json`` as the engine stores it: the same if it is a
    valid inventory, else an unavailable one saying why (an archive is untrusted input)."""
    try:
        if len(raw) > MAX_BYTES:
            raise ValueError(f"it is larger than {MAX_BYTES // 1024} KiB")
        try:
            doc = json.loads(raw.decode(), parse_constant=_no_constant)
        except (ValueError, RecursionError):
            raise ValueError("it is not valid JSON") from None
        return json.dumps(check(doc)).encode()
    except ValueError as e:
        return json.dumps(unavailable(f"the imported inventory was refused: {e}")).encode()


def check(doc: Any) -> dict[str, Any]:
    """``doc`` if it is an inventory of the exact schema, within bounds and sorted by name;
    else a :class:`ValueError` naming the first problem."""
    _exact_fields(doc, _TOP_FIELDS, "the inventory")
    if doc["status"] not in ("ok", "unavailable"):
        raise ValueError("status must be 'ok' or 'unavailable'")
    _optional_text(doc["reason"], "reason", MAX_REASON)
    if type(doc["truncated"]) is not bool:
        raise ValueError("truncated must be true or false")
    _count(doc["elapsed_ms"], "elapsed_ms")
    variables = doc["variables"]
    if type(variables) is not list or len(variables) > MAX_VARIABLES:
        raise ValueError(f"variables must be a list of at most {MAX_VARIABLES}")
    names = []
    for i, variable in enumerate(variables):
        where = f"variables[{i}]"
        _exact_fields(variable, _VARIABLE_FIELDS, where)
        for key in ("name", "type"):
            if _optional_text(variable[key], f"{where}.{key}", MAX_TEXT) is None:
                raise ValueError(f"{where}.{key} must be text")
        shape = variable["shape"]
        if shape is not None:
            if type(shape) is not list or len(shape) > MAX_DIMENSIONS:
                raise ValueError(f"{where}.shape must be a list of at most {MAX_DIMENSIONS}")
            for n in shape:
                _count(n, f"{where}.shape")
        for key in ("length", "bytes"):
            if variable[key] is not None:
                _count(variable[key], f"{where}.{key}")
        fingerprint = variable["fingerprint"]
        if fingerprint is not None and (
            type(fingerprint) is not str or not _FINGERPRINT.fullmatch(fingerprint)
        ):
            raise ValueError(f"{where}.fingerprint must be null or 'f:'/'s:' and 32 hex digits")
        names.append(variable["name"])
    if names != sorted(set(names)):
        raise ValueError("variables must be sorted by name, each name once")
    return doc


def _field(parent: Any, key: str, kind: type, missing: str) -> Any:
    value = parent.get(key) if type(parent) is dict else None
    if type(value) is not kind:
        raise ValueError(missing)
    return value


def _clip(value: Any) -> str:
    text = value if type(value) is str else "?"
    return text if len(text) <= 200 else text[:199] + "…"


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _exact_fields(value: Any, fields: set[str], where: str) -> None:
    if type(value) is not dict:
        raise ValueError(f"{where} must be an object")
    if set(value) != fields:
        extra, missing = sorted(set(value) - fields), sorted(fields - set(value))
        extra = [_clip(k) for k in extra[:3]]
        raise ValueError(f"{where}: unknown fields {extra}, missing {missing}")


def _optional_text(value: Any, where: str, most: int) -> str | None:
    if value is not None and (type(value) is not str or not 0 < len(value) <= most):
        raise ValueError(f"{where} must be null or 1-{most} characters")
    return value


def _count(value: Any, where: str) -> None:
    if type(value) is not int or not 0 <= value <= MAX_INT:
        raise ValueError(f"{where} must be an integer from 0 to 2**63-1")
