"""What the published PandaStack SDKs call that the engine does not serve: a JSON 501 naming
it (after the API key, like every endpoint), never a bare 404 that reads like a bug. The
README lists the same ("PandaStack's SDKs")."""

from __future__ import annotations

from sandfork.engine.errors import ApiError
from sandfork.engine.handlers.base import ApiHandler

PANDASTACK_ONLY = (
    "apps",
    "databases",
    "functions",
    "schedules",
    "volumes",
    "tokens",
    "me",
    "repos",
    "preview-repos",
)
"""PandaStack's hosted services beyond sandboxes, one path each under ``/v1``."""


class NotServed(ApiError):
    """A PandaStack endpoint the engine does not serve (501)."""

    status = 501


class NotServedHandler(ApiHandler):
    """Every method: 501, saying what is not served and what to use instead."""

    def check_request(self) -> None:
        super().check_request()
        path = self.request.path.removeprefix("/v1/")
        if path.startswith("templates"):
            why = (
                "templates are built from the project's specs on this machine (sandfork "
                "template build NAME, or on first use), not uploaded, pushed or deleted"
            )
        else:
            why = f"PandaStack's hosted service {path.split('/', 1)[0]!r} is not a sandbox's"
        raise NotServed(
            f"not served by Sandfork: {self.request.method} {self.request.path}: {why} "
            "(the README lists what the engine serves of PandaStack's SDKs)"
        )

    async def _refused(self, *_args: str) -> None:
        """Never called: :meth:`check_request` refused the request."""

    get = post = put = patch = delete = _refused
