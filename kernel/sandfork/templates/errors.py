"""The one exception type of the template builder."""

from __future__ import annotations

__all__ = ["TemplateError"]


class TemplateError(Exception):
    """A template spec is invalid, or building a template failed.

    The message is meant for a person: it names the spec file and field, or the command
    that failed together with the end of its output.
    """
