"""Checks of the guest agent's results, one per operation the engine uses them from.

Guest code runs as root and can write frames on the agent's port, so a result is as
untrusted as an imported manifest and is checked with the same helpers
(:mod:`sandfork.manifest_checks`): the fields the engine uses must be there with their types,
every bound the agent keeps is applied again here (output per stream within
``max_output_bytes``, file data within what was asked, list lengths, string sizes), and only
those fields go on. A result that fails is :class:`AgentBadReply`, which the API reports as a
502 "the guest agent sent an invalid reply: …"; output over its bound is cut with the agent's
own marker instead, as the agent would have.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from sandfork.backends.agent_link import AgentBadReply
from sandfork.engine import outputs
from sandfork.manifest_checks import fields, flag, integer, matching, number, text
from sandfork.protocol import CONTEXT_ID

MAX_ENTRIES = 10000  # of a directory listing (the agent's own bound)
MAX_CONTEXTS = 4096
MAX_PORTS = 1000  # of a ports listing (the agent's own bound)
MAX_PATH = 4096  # characters of a name or path in a stat record
MAX_INT = 2**63 - 1
_MODE = re.compile(r"[0-7]{3,6}")
_CONTEXT = re.compile(CONTEXT_ID)
_CONTEXT_STATUSES = frozenset({"starting", "running", "dead", "stopped"})
_EXEC_FIELDS = ("exit_code", "stdout", "stderr", "duration_ms", "timed_out", "truncated")


def _fail(message: str) -> AgentBadReply:
    return AgentBadReply(message)


def exec_result(result: object, max_output: int) -> dict[str, Any]:
    """An ``exec`` result: its fields checked, each stream within ``max_output`` bytes."""
    r = fields(result, "the exec result", _EXEC_FIELDS, _fail, others=True)
    stdout, cut_out = outputs.rebound(text(r["stdout"], "stdout", MAX_INT, _fail), max_output)
    stderr, cut_err = outputs.rebound(text(r["stderr"], "stderr", MAX_INT, _fail), max_output)
    return {
        "exit_code": integer(r["exit_code"], "exit_code", 0, 255, _fail),
        "stdout": stdout,
        "stderr": stderr,
        "duration_ms": number(r["duration_ms"], "duration_ms", 0, 1e15, _fail),
        "timed_out": flag(r["timed_out"], "timed_out", _fail),
        "truncated": flag(r["truncated"], "truncated", _fail) or cut_out or cut_err,
    }


def stream_event(event: object) -> tuple[str, str]:
    """A streamed ``exec``'s event: the stream's name and its text."""
    e = fields(event, "an output event", ("event", "data"), _fail, others=True)
    if e["event"] not in ("stdout", "stderr"):
        raise _fail("an output event must be stdout or stderr")
    return e["event"], text(e["data"], "an output event's data", MAX_INT, _fail)


def file_data(result: object, most: int) -> bytes:
    """An ``fs.read`` result's bytes, which may be no more than the ``most`` asked for."""
    r = fields(result, "the fs.read result", ("data", "size"), _fail, others=True)
    encoded = text(r["data"], "data", (most + 2) // 3 * 4, _fail)
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _fail("data must be base64") from None
    if integer(r["size"], "size", 0, most, _fail) != len(data):
        raise _fail("size is not the length of data")
    return data


def written(result: object, most: int) -> dict[str, Any]:
    """An ``fs.write`` result: the path written and its size."""
    r = fields(result, "the fs.write result", ("path", "size"), _fail, others=True)
    return {
        "path": text(r["path"], "path", MAX_PATH, _fail),
        "size": integer(r["size"], "size", 0, most, _fail),
    }


def stat(entry: object, where: str = "the fs.stat result") -> dict[str, Any]:
    """A stat record: ``{name, path, is_dir, size, mode, mtime}``."""
    names = ("name", "path", "is_dir", "size", "mode", "mtime")
    e = fields(entry, where, names, _fail, others=True)
    return {
        "name": text(e["name"], f"{where}.name", MAX_PATH, _fail),
        "path": text(e["path"], f"{where}.path", MAX_PATH, _fail),
        "is_dir": flag(e["is_dir"], f"{where}.is_dir", _fail),
        "size": integer(e["size"], f"{where}.size", 0, MAX_INT, _fail),
        "mode": matching(e["mode"], f"{where}.mode", _MODE, _fail),
        "mtime": integer(e["mtime"], f"{where}.mtime", -MAX_INT, MAX_INT, _fail),
    }


def listing(result: object) -> dict[str, Any]:
    """An ``fs.list`` result: at most :data:`MAX_ENTRIES` stat records."""
    r = fields(result, "the fs.list result", ("entries", "truncated"), _fail, others=True)
    entries = _bounded_list(r["entries"], "entries", MAX_ENTRIES)
    return {
        "entries": [stat(e, f"entries[{i}]") for i, e in enumerate(entries)],
        "truncated": flag(r["truncated"], "truncated", _fail),
    }


def context(result: object, where: str = "the code context") -> dict[str, Any]:
    """A code context: ``{id, language, status}``."""
    r = fields(result, where, ("id", "language", "status"), _fail, others=True)
    if r["status"] not in _CONTEXT_STATUSES:
        raise _fail(f"{where}.status must be one of {sorted(_CONTEXT_STATUSES)}")
    return {
        "id": matching(r["id"], f"{where}.id", _CONTEXT, _fail),
        "language": text(r["language"], f"{where}.language", 64, _fail),
        "status": r["status"],
    }


def contexts(result: object) -> dict[str, Any]:
    """A ``ctx.list`` result: ``{"contexts": [context…]}``."""
    r = fields(result, "the ctx.list result", ("contexts",), _fail, others=True)
    found = _bounded_list(r["contexts"], "contexts", MAX_CONTEXTS)
    return {"contexts": [context(c, f"contexts[{i}]") for i, c in enumerate(found)]}


def ports(result: object) -> list[int]:
    """A ``ports`` result: ``{"ports": [1-65535…]}``, at most :data:`MAX_PORTS`."""
    r = fields(result, "the ports result", ("ports",), _fail, others=True)
    found = _bounded_list(r["ports"], "ports", MAX_PORTS)
    return sorted({integer(p, f"ports[{i}]", 1, 65535, _fail) for i, p in enumerate(found)})


def _bounded_list(value: object, where: str, most: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > most:
        raise _fail(f"{where} must be a list of at most {most}")
    return value
