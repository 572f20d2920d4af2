"""``/v1/templates``: the templates sandboxes can be created from."""

from __future__ import annotations

from typing import Any

from sandfork.engine.errors import NotFound
from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.handlers.not_served import NotServed
from sandfork.templates import BuiltTemplate, TemplateSpec, list_specs


def _describe(spec: TemplateSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "description": spec.description,
        "memory_mb": spec.memory_mb,
        "cpu": spec.cpu,
        "built": BuiltTemplate.find(spec) is not None,
    }


class TemplatesHandler(ApiHandler):
    """``GET`` lists templates and whether each is built: a JSON array, what both published
    PandaStack SDKs read (the TypeScript one takes nothing else)."""

    async def get(self) -> None:
        self.write_json([_describe(spec) for spec in list_specs()])


class TemplateHandler(ApiHandler):
    """``GET``: one template (PandaStack's ``templates.get``); ``DELETE`` is not served."""

    async def get(self, name: str) -> None:
        for spec in list_specs():
            if spec.name == name:
                self.write_json(_describe(spec))
                return
        raise NotFound(f"no template {name[:64]!r}")

    async def delete(self, name: str) -> None:
        raise NotServed(
            f"not served by Sandfork: DELETE /v1/templates/{name[:64]}: templates are built "
            "from the project's specs on this machine, not deleted through the API"
        )


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
