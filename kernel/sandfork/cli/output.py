"""How list commands print: a table for people, ``--json`` for scripts; ids never cut."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from sandfork.protocol import WireModel

__all__ = ["console", "print_records", "record"]

console = Console()
_FOLDED = 20
"""Width down to which a table's last column (free text) may fold before plain columns."""


def record(obj: WireModel) -> dict[str, Any]:
    """An SDK handle (``Sandbox``, ``Snapshot``) as the API's JSON object."""
    return obj.to_api()


def _cell(value: Any, fmt: Callable[[Any], str] | None) -> str:
    if value is None:
        return ""
    return fmt(value) if fmt else str(value)


def print_records(
    rows: Iterable[dict[str, Any]],
    columns: Sequence[tuple[str, str]],
    as_json: bool,
    formats: Mapping[str, Callable[[Any], str]] | None = None,
) -> None:
    """Print ``rows`` as a JSON array (``as_json``: every field, raw) or for people.

    ``columns`` are the (key, heading) pairs shown, ``formats`` how to show some keys'
    values. No cell but the last column's is ever cut or wrapped (ids must stay copyable):
    a table when it fits the terminal (the last column may fold there), else aligned plain
    columns that the terminal may wrap as whole lines.
    """
    rows = list(rows)
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    formats = formats or {}
    cells = [[_cell(row[key], formats.get(key)) for key, _ in columns] for row in rows]
    headings = [heading for _, heading in columns]
    widths = [max(len(text) for text in column) for column in zip(headings, *cells, strict=True)]
    if sum(widths[:-1]) + min(widths[-1], _FOLDED) + 3 * len(widths) + 1 > console.width:
        for line in (headings, *cells):
            padded = (text.ljust(width) for text, width in zip(line, widths, strict=True))
            print("  ".join(padded).rstrip())
        return
    table = Table()
    for heading in headings[:-1]:
        table.add_column(heading, no_wrap=True)
    table.add_column(headings[-1], overflow="fold")
    for line in cells:
        table.add_row(*line)
    console.print(table)
