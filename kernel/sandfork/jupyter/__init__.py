"""Jupyter integration: the server extension behind JupyterLab's Snapshot, Restore and Fork
(REST API in docs/jupyter-api.md); the lab extension's built files ship beside it."""

from __future__ import annotations

from typing import Any

from sandfork.jupyter.app import SandforkExtension


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "sandfork.jupyter", "app": SandforkExtension}]
