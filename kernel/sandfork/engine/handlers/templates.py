"""``/v1/templates``: the templates sandboxes can be created from."""

from __future__ import annotations

from sandfork.engine.handlers.base import ApiHandler
from sandfork.templates import BuiltTemplate, list_specs


class TemplatesHandler(ApiHandler):
    """``GET`` lists templates and whether each is built."""

    async def get(self) -> None:
        items = []
        for spec in list_specs():
            built = BuiltTemplate.find(spec)
            items.append(
                {
                    "name": spec.name,
                    "description": spec.description,
                    "memory_mb": spec.memory_mb,
                    "cpu": spec.cpus,
                    "built": built is not None,
                }
            )
        self.write_json({"items": items})


class HealthHandler(ApiHandler):
    """``GET``: the engine is up; with the accelerator and sandbox count."""

    async def get(self) -> None:
        backend = self.sandboxes.backend
        self.write_json(
            {
                "status": "ok",
                "backend": backend.name,
                "accelerator": backend.accelerator,
                "sandboxes": len(self.sandboxes.all()),
            }
        )
