"""``/v1/sandboxes``: create, list, get and delete sandboxes."""

from __future__ import annotations

from sandfork.engine.errors import ApiError, BadRequest
from sandfork.engine.handlers.base import ApiHandler, field
from sandfork.engine.handlers.leases import lease_field
from sandfork.engine.handlers.validate import metadata_field, template_field, text_field
from sandfork.protocol import MIN_MEMORY_MB


class SandboxesHandler(ApiHandler):
    """``GET`` lists sandboxes; ``POST`` creates one."""

    async def get(self) -> None:
        self.write_json({"items": [r.to_api() for r in self.sandboxes.all()]})

    async def post(self) -> None:
        body = self.json_body()
        limits = self.settings["config"]
        template = template_field(body, limits.default_template)
        memory_mb = field(body, "memory_mb", int)
        cpu = field(body, "cpu", int)
        if memory_mb is not None and not MIN_MEMORY_MB <= memory_mb <= limits.max_memory_mb:
            raise BadRequest(
                f"memory_mb must be between {MIN_MEMORY_MB} and {limits.max_memory_mb}"
            )
        if cpu is not None and not 1 <= cpu <= limits.max_cpus:
            raise BadRequest(f"cpu must be between 1 and {limits.max_cpus}")
        metadata = metadata_field(body, limits)
        persistent = bool(field(body, "persistent", bool, False))
        lease = lease_field(body)  # killed unless renewed (POST .../lease) within this
        if lease is not None and persistent:
            raise BadRequest("a persistent sandbox holds no lease")
        host_access = bool(field(body, "host_access", bool, False))
        if host_access and not limits.allow_host_access:
            raise ApiError(
                "host_access is disabled on this engine (start it with --allow-host-access)", 403
            )
        backend = text_field(body, "backend", 16)
        from_snapshot = text_field(body, "from_snapshot", 64)
        if from_snapshot is not None:
            if backend not in (None, "auto"):
                raise BadRequest("a snapshot restores on the backend that took it: give no backend")
            record = await self.sandboxes.create_from_snapshot(
                from_snapshot, metadata=metadata, persistent=persistent, host_access=host_access
            )
            if lease is not None:
                self.sandboxes.lease(record.id, lease)
            self.write_json(record.to_api(), 201)
            return
        record = await self.sandboxes.create(
            template,
            memory_mb=memory_mb,
            cpu=cpu,
            metadata=metadata,
            persistent=persistent,
            host_access=host_access,
            backend=backend,
        )
        if lease is not None:
            self.sandboxes.lease(record.id, lease)
        self.write_json(record.to_api(), 201)


class SandboxHandler(ApiHandler):
    """``GET`` one sandbox; ``DELETE`` kills it."""

    async def get(self, sandbox_id: str) -> None:
        self.write_json(self.sandboxes.get(sandbox_id).to_api())

    async def delete(self, sandbox_id: str) -> None:
        await self.sandboxes.kill(sandbox_id)
        self.set_status(204)
        self.finish()
