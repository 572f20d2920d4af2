"""``/v1/sandboxes/{id}/lease``: renew a sandbox's lease (see :mod:`sandfork.engine.leases`)."""

from __future__ import annotations

from typing import Any

from sandfork.engine.errors import BadRequest
from sandfork.engine.handlers.base import ApiHandler, field
from sandfork.engine.leases import MAX_SECONDS, MIN_SECONDS


def lease_field(body: dict[str, Any]) -> float | None:
    """The optional ``lease_seconds`` of a request, within the engine's bounds."""
    value = field(body, "lease_seconds", (int, float))
    if value is None:
        return None
    if not MIN_SECONDS <= value <= MAX_SECONDS:
        raise BadRequest(
            f"lease_seconds must be between {MIN_SECONDS:g} and {MAX_SECONDS:g}, got {value}"
        )
    return float(value)


class LeaseHandler(ApiHandler):
    """``POST`` starts or renews the lease: body ``{"lease_seconds": n}``, optional when the
    sandbox has one already (the same period again)."""

    async def post(self, sandbox_id: str) -> None:
        record = self.sandboxes.lease(sandbox_id, lease_field(self.json_body()))
        remaining = self.sandboxes.lease_remaining(sandbox_id)
        self.write_json(
            {"id": record.id, "lease_seconds": record.lease_seconds, "expires_in": remaining}
        )
