"""Errors the handlers answer with: a status and a message meant for the user."""

from __future__ import annotations

from tornado import web


def http_error(status: int, message: str) -> web.HTTPError:
    """An HTTP error carrying ``message`` verbatim (it may contain ``%``, which tornado's
    logging would otherwise try to format)."""
    return web.HTTPError(status, "%s", message)


def error_message(error: web.HTTPError) -> str:
    """The user-facing message of an HTTP error."""
    if not error.log_message:
        return error.reason or f"HTTP {error.status_code}"
    return error.log_message % error.args if error.args else error.log_message
