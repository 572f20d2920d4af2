"""``/v1/sandboxes/{id}/lease``: renew a sandbox's lease (see :mod:`sandfork.engine.leases`);
``/v1/sandboxes/{id}/lifecycle``: PandaStack's time to live and ``persistent`` flag over it."""

from __future__ import annotations

import time
from typing import Any

from sandfork.engine.errors import BadRequest
from sandfork.engine.handlers.base import ApiHandler, field
from sandfork.engine.leases import MAX_SECONDS, MAX_TTL_SECONDS, MIN_SECONDS
from sandfork.engine.ledger import now
from sandfork.protocol import OnExpiry


def lease_field(
    body: dict[str, Any], name: str = "lease_seconds", most: float = MAX_SECONDS
) -> float | None:
    """The optional ``lease_seconds`` (or ``name``) of a request, within the engine's bounds."""
    value = field(body, name, (int, float))
    if value is None:
        return None
    if not MIN_SECONDS <= value <= most:
        raise BadRequest(f"{name} must be between {MIN_SECONDS:g} and {most:g}, got {value}")
    return float(value)


def on_expiry_field(body: dict[str, Any]) -> OnExpiry | None:
    """The optional ``on_expiry``: what the sandbox's time to live running out does."""
    value = field(body, "on_expiry", str)
    try:
        return None if value is None else OnExpiry(value)
    except ValueError:
        allowed = ", ".join(OnExpiry)
        raise BadRequest(f"on_expiry must be one of {allowed}, not {value!r}") from None


class LeaseHandler(ApiHandler):
    """``POST`` starts or renews the lease: body ``{"lease_seconds": n}``, optional when the
    sandbox has one already (the same period again)."""

    async def post(self, sandbox_id: str) -> None:
        record = self.sandboxes.lease(sandbox_id, lease_field(self.json_body()))
        remaining = self.sandboxes.lease_remaining(sandbox_id)
        self.write_json(
            {"id": record.id, "lease_seconds": record.lease_seconds, "expires_in": remaining}
        )


class LifecycleHandler(ApiHandler):
    """PandaStack's lifecycle. ``GET``: ``{id, persistent, ttl_seconds, expires_in,
    expires_at}``. ``PATCH {"ttl_seconds"?: n | null, "persistent"?: bool}`` changes them and
    answers the same.

    A time to live is the sandbox's lease: it is killed when the TTL runs out (hibernated with
    ``"on_expiry": "hibernate"``: :meth:`~sandfork.engine.sandboxes.SandboxService.expired`),
    unless renewed first
    (another PATCH, or ``POST .../lease``); ``null`` ends it. A persistent sandbox has
    none: making one persistent ends its lease, and a TTL for it is a 400.
    """

    async def get(self, sandbox_id: str) -> None:
        self.write_json(self._lifecycle(sandbox_id))

    async def patch(self, sandbox_id: str) -> None:
        body = self.json_body()
        unknown = sorted(set(body) - {"ttl_seconds", "persistent", "on_expiry"})
        if unknown:
            raise BadRequest(f"unknown field {unknown[0]!r} (ttl_seconds, persistent, on_expiry)")
        persistent = field(body, "persistent", bool)
        ttl = lease_field(body, "ttl_seconds", MAX_TTL_SECONDS)
        on_expiry = on_expiry_field(body)
        if persistent and ttl is not None:
            raise BadRequest("a persistent sandbox has no time to live")
        if on_expiry is not None:
            record = self.sandboxes.get(sandbox_id)
            record.on_expiry = on_expiry
            self.sandboxes.save(record)
        if persistent is not None:
            self.sandboxes.set_persistent(sandbox_id, persistent)
        if ttl is not None:
            self.sandboxes.lease(sandbox_id, ttl)
        elif "ttl_seconds" in body:
            self.sandboxes.end_lease(sandbox_id)
        self.write_json(self._lifecycle(sandbox_id))

    def _lifecycle(self, sandbox_id: str) -> dict[str, Any]:
        record = self.sandboxes.get(sandbox_id)
        left = self.sandboxes.lease_remaining(sandbox_id)
        return {
            "id": record.id,
            "persistent": record.persistent,
            "ttl_seconds": record.lease_seconds,
            "on_expiry": record.on_expiry,
            "expires_in": left,
            "expires_at": None if left is None else now(time.time() + left),
        }
