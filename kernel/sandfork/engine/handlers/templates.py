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
    """``GET``: the engine is up; its default backend (and why), each backend's accelerator
    or why it cannot run here, and the sandbox count."""

    async def get(self) -> None:
        backends = self.sandboxes.backends
        default = backends[backends.default]
        self.write_json(
            {
                "status": "ok",
                "backend": default.name,
                "isolation": default.isolation,
                "accelerator": default.accelerator,
                "why": backends.why,
                "backends": {
                    name: {"accelerator": b.accelerator, "unavailable": backends.reasons.get(name)}
                    for name, b in backends.all().items()
                },
                "sandboxes": len(self.sandboxes.all()),
            }
        )
