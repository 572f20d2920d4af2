"""Output kept within a budget: what exec and run_code return, and the ledger records.

One rule for every kind of output a guest produces (a command's streams, a cell's streams,
its rich results and its error): at most ``max_output_bytes`` of each is kept, the rest is
counted and dropped, and what was dropped is said by the marker the guest agent uses,
``[sandfork: output truncated, N bytes omitted]``. Text is counted in UTF-8 bytes (a lone
surrogate, which JSON can carry, as the three bytes Python would give it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colours of IPython's tracebacks
RESULT_OVERHEAD = 64  # bytes a rich result's entry costs beyond its MIME type and data
_MARKER_SLACK = 64  # longest marker the agent appends to text it cut


def marker(omitted: int) -> str:
    """The line that ends output of which ``omitted`` bytes were dropped."""
    return f"\n[sandfork: output truncated, {omitted} bytes omitted]\n"


def size(text: str) -> int:
    """Bytes of ``text`` in UTF-8."""
    return len(text.encode(errors="surrogatepass"))


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` bytes of UTF-8, ending with the marker when anything went."""
    data = text.encode(errors="surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + marker(len(data) - limit)


def rebound(text: str, limit: int) -> tuple[str, bool]:
    """An agent's kept output bounded again on the host: unchanged within what the agent may
    send (``limit`` characters, one per byte it kept, and its marker), else cut to ``limit``
    bytes with the marker. Returns the text and whether the host cut it."""
    if len(text) <= limit + _MARKER_SLACK:
        return text, False
    return truncate(text, limit), True


@dataclass
class Rebounded:
    """A streamed command's output events as the agent sends them, bounded again on the host
    per stream (as :func:`rebound`: in characters, the agent's marker allowed)."""

    limit: int
    kept: dict[str, int] = field(default_factory=dict)

    def event(self, name: str, data: str) -> str | None:
        """``data`` of the stream ``name``, cut at the bound with the marker; None past it."""
        room = self.limit + _MARKER_SLACK - self.kept.get(name, 0)
        if room <= 0:
            return None
        if len(data) > room:
            data = data[:room] + marker(size(data[room:]))
        self.kept[name] = self.kept.get(name, 0) + len(data)
        return data


@dataclass
class Stream:
    """One output stream of a cell (stdout or stderr), kept up to ``limit`` bytes."""

    limit: int
    parts: list[str] = field(default_factory=list)
    kept: int = 0
    omitted: int = 0

    def add(self, text: str) -> None:
        """Append ``text``, as much of it as fits; count the rest."""
        n = size(text)
        room = self.limit - self.kept
        if n > room:
            text = text.encode(errors="surrogatepass")[: max(room, 0)].decode(errors="ignore")
            self.omitted += n - size(text)
        self.parts.append(text)
        self.kept += size(text)

    def text(self) -> str:
        """What the stream kept, with the marker if anything went."""
        kept = "".join(self.parts)
        return kept + marker(self.omitted) if self.omitted else kept


@dataclass
class Results:
    """A cell's rich results (``execute_result`` and ``display_data``, one entry per MIME
    type), kept while they fit in ``limit`` bytes together; one that does not is dropped."""

    limit: int
    items: list[dict[str, Any]] = field(default_factory=list)
    kept: int = 0
    omitted: int = 0

    def add(self, data: object, is_main_result: bool) -> None:
        """Add the MIME bundle ``data`` of one result (untrusted: anything JSON)."""
        if not isinstance(data, dict):
            return
        for mime, value in data.items():
            try:
                text = value if isinstance(value, str) else json.dumps(value)
            except (ValueError, RecursionError):
                continue  # not JSON the API could send
            cost = size(mime) + size(text) + RESULT_OVERHEAD
            if self.kept + cost > self.limit:
                self.omitted += cost
                continue
            self.kept += cost
            self.items.append({"type": mime, "data": text, "is_main_result": is_main_result})

    def to_api(self) -> list[dict[str, Any]]:
        """The kept results, then one ``text/plain`` entry with the marker if any went."""
        if not self.omitted:
            return list(self.items)
        note = {"type": "text/plain", "data": marker(self.omitted).strip(), "is_main_result": False}
        return [*self.items, note]


def error(content: dict[str, Any], limit: int) -> dict[str, Any]:
    """A cell's ``error`` message as the API shows it, at most ``limit`` bytes of text in
    all: its name and value cut to the limit, then traceback lines (without their colours)
    while they fit, the last one the marker."""
    name = truncate(_text(content.get("ename")), min(limit, 1024))
    value = truncate(_text(content.get("evalue")), limit)
    left = limit - size(name) - size(value)
    lines, omitted = [], 0
    raw = content.get("traceback")
    for line in raw if isinstance(raw, list) else []:
        text = _ANSI.sub("", _text(line))
        if omitted or size(text) > left:
            omitted += size(text)
            continue
        left -= size(text)
        lines.append(text)
    if omitted:
        lines.append(marker(omitted).strip())
    return {"name": name, "value": value, "traceback": lines}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
