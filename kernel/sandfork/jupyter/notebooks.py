"""Notebook documents: checking what the front end sends, and writing new notebooks under
names that collide with nothing."""

from __future__ import annotations

import posixpath
from typing import Any

import nbformat
from jupyter_server.utils import ensure_async

from sandfork.jupyter.errors import http_error

MAX_PROBES = 1000


def checked_notebook(document: Any) -> dict[str, Any]:
    """``document`` if it is a valid nbformat 4 notebook, else a 400."""
    if not isinstance(document, dict):
        raise http_error(400, "field 'notebook' must be a notebook document (JSON object)")
    try:
        nb = nbformat.from_dict(document)
        nbformat.validate(nb)
    except (nbformat.ValidationError, ValueError, TypeError, KeyError) as e:
        raise http_error(400, f"field 'notebook' is not a valid notebook: {e}") from e
    if nb.get("nbformat") != 4:
        raise http_error(400, "only nbformat 4 notebooks are supported")
    return dict(nb)


def checked_path(path: Any) -> str:
    """A notebook path relative to the server root (``dir/name.ipynb``), else a 400."""
    if not isinstance(path, str) or not path.endswith(".ipynb"):
        raise http_error(400, "field 'path' must be the notebook's path, ending in .ipynb")
    clean = posixpath.normpath(path.lstrip("/"))
    if clean.startswith("../") or clean == "..":
        raise http_error(400, f"path {path!r} leaves the server's root")
    return clean


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
