"""Notebook documents: checking what the front end sends, and writing new notebooks under
names that collide with nothing."""

from __future__ import annotations

import posixpath
import unicodedata
from typing import Any

import nbformat
from jupyter_server.utils import ensure_async

from sandfork import strict_json
from sandfork.jupyter.errors import http_error

MAX_PROBES = 1000
MAX_PATH_BYTES = 1024  # a notebook path, relative to the root
MAX_NAME_BYTES = 200  # its file name: 255 less the suffix of a new notebook's name


def checked_notebook(
    document: Any, what: str = "field 'notebook'", status: int = 400
) -> dict[str, Any]:
    """``document`` if it is a valid nbformat 4 notebook, else a 400 (``status``) naming
    ``what``."""
    if not isinstance(document, dict):
        raise http_error(status, f"{what} must be a notebook document (JSON object)")
    try:
        nb = nbformat.from_dict(document)
        nbformat.validate(nb)
    except (nbformat.ValidationError, ValueError, TypeError, KeyError) as e:
        raise http_error(status, f"{what} is not a valid notebook: {e}") from e
    if nb.get("nbformat") != 4:
        raise http_error(status, f"{what} is not an nbformat 4 notebook (the only kind supported)")
    return dict(nb)


def stored_notebook(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The notebook document stored with a snapshot, checked like one sent (anyone with the
    engine's key may have written it); a 422 when it is no notebook."""
    what = "the snapshot's notebook"
    try:
        document = strict_json.parse(raw, what, max_depth)
    except strict_json.JsonRefused as e:
        raise http_error(422, e.message) from None
    return checked_notebook(document, what, 422)


def checked_path(path: Any, what: str = "field 'path'", status: int = 400) -> str:
    """A notebook path relative to the server root (``dir/name.ipynb``), normalized; else a
    400 (``status``) naming ``what``. The extension's one rule for the paths it writes: it
    does not count on the contents manager to keep them inside the root.

    Refused: anything but text ending in ``.ipynb``; an absolute path or one that leaves the
    root (``..``); control characters (NUL among them) and lone surrogates; a path longer
    than :data:`MAX_PATH_BYTES` or a file name longer than :data:`MAX_NAME_BYTES` (UTF-8),
    which leaves room for the suffix a new notebook's name gets (``-restored-12``).
    """
    if not isinstance(path, str) or not path.endswith(".ipynb"):
        raise http_error(status, f"{what} must be the notebook's path, ending in .ipynb")
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in path):
        raise http_error(status, f"{what} must not contain control characters (NUL, newline...)")
    if len(path.encode()) > MAX_PATH_BYTES:
        raise http_error(status, f"{what} is longer than {MAX_PATH_BYTES} bytes")
    if path.startswith("/"):
        raise http_error(status, f"{what} must be relative to the server's root, not {path!r}")
    clean = posixpath.normpath(path)
    if clean.startswith("../") or clean == "..":
        raise http_error(status, f"{what} {path!r} leaves the server's root")
    if len(posixpath.basename(clean).encode()) > MAX_NAME_BYTES:
        raise http_error(status, f"{what} names a file longer than {MAX_NAME_BYTES} bytes")
    return clean


def stored_path(path: Any) -> str:
    """The notebook path stored in a snapshot's metadata (``Untitled.ipynb`` when none),
    checked by :func:`checked_path`: the metadata is the client's, untrusted; a 422."""
    if path is None or path == "":
        return "Untitled.ipynb"
    return checked_path(path, "the snapshot's notebook_path", 422)


async def free_path(contents_manager: Any, original: str, suffix: str) -> str:
    """``dir/stem-<suffix>-N.ipynb`` next to ``original``, with the first N not taken."""
    directory, name = posixpath.split(original)
    stem = name.removesuffix(".ipynb")
    for n in range(1, MAX_PROBES):
        candidate = posixpath.join(directory, f"{stem}-{suffix}-{n}.ipynb")
        if not await _exists(contents_manager, candidate):
            return candidate
    raise http_error(409, f"no free name for {stem}-{suffix}-N.ipynb in {directory or '/'}")


async def write_notebook(contents_manager: Any, path: str, document: dict[str, Any]) -> None:
    """Save ``document`` as the notebook ``path``."""
    model = {"type": "notebook", "format": "json", "content": nbformat.from_dict(document)}
    await ensure_async(contents_manager.save(model, path))


async def delete_quietly(contents_manager: Any, path: str) -> None:
    """Delete a notebook written by an operation that then failed."""
    try:
        await ensure_async(contents_manager.delete(path))
    except Exception:  # cleanup: the original error is the one to report
        pass


async def _exists(contents_manager: Any, path: str) -> bool:
    return bool(await ensure_async(contents_manager.exists(path)))
