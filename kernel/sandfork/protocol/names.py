"""Rules for the names a user gives (snapshots, checkpoints, attachments); a ValueError
names what is wrong, which the engine answers with a 400."""

from __future__ import annotations

import re
import unicodedata

from sandfork.protocol.limits import MAX_SNAPSHOT_NAME

INVENTORY_ATTACHMENT = "inventory.json"  # the variable inventory the engine stores; not a client's

_ATTACHMENT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


# Characters a name may not hold: controls (Cc), format characters (Cf: the bidirectional
# controls U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C among them, which reorder how
# the text around them is shown), line and paragraph separators (Zl, Zp) and lone surrogates
# (Cs). Private-use (Co) and unassigned (Cn) code points are allowed: they carry no direction
# or formatting, and what is unassigned depends on the Unicode version of each Python (an
# emoji newer than the engine's would be refused by it and not by its client).
_NOT_IN_NAMES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# ... except the zero-width (non-)joiners, which emoji sequences and Persian and Indic
# scripts need, and which move no text.
_JOINERS = frozenset({"\u200c", "\u200d"})


def check_snapshot_name(name: str) -> str:
    """``name`` if it is a valid snapshot name, else a :class:`ValueError` saying why.

    A name is 1-:data:`MAX_SNAPSHOT_NAME` characters of printable text: not only spaces (or
    joiners), with no control, format or bidirectional-control character (see
    ``_NOT_IN_NAMES``). The same rule holds for every name a user gives (checkpoints are
    snapshots).
    """
    rule = f"a snapshot name must be 1-{MAX_SNAPSHOT_NAME} printable characters"
    if not isinstance(name, str) or not name or len(name) > MAX_SNAPSHOT_NAME:
        raise ValueError(rule)
    for at, char in enumerate(name):
        if char not in _JOINERS and unicodedata.category(char) in _NOT_IN_NAMES:
            what = " ".join(filter(None, (f"U+{ord(char):04X}", unicodedata.name(char, ""))))
            raise ValueError(
                f"{rule}, without control, format or bidirectional characters "
                f"({what} at position {at})"
            )
    if all(char.isspace() or char in _JOINERS for char in name):
        raise ValueError(f"{rule}, not only spaces")
    return name


def check_attachment_name(name: str) -> str:
    """``name`` if it is a valid attachment name (a plain file name), else a ValueError."""
    if not _ATTACHMENT_NAME.fullmatch(name):
        raise ValueError(
            f"bad attachment name {name!r}: 1-100 of letters, digits, '.', '_' and '-'"
        )
    return name
