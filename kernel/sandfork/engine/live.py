"""A running sandbox as the engine holds it (:class:`Live`), and the engine's calls to its
guest agent, each reply checked and each failure mapped to an API error."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sandfork.backends.agent_link import (
    AgentBadReply,
    AgentErrorReply,
    AgentUnavailable,
    default_wait,
)
from sandfork.backends.base import Instance
from sandfork.engine.code_runner import CodeRunner
from sandfork.engine.db import SandboxRecord
from sandfork.engine.egress_tunnel import EgressTunnel
from sandfork.engine.errors import ApiError, BadReply, Conflict, Unresponsive

_AGENT_ERROR_STATUS = {
    "BadRequest": 400,
    "IsADirectory": 400,
    "NotADirectory": 400,
    "PermissionDenied": 403,
    "NotFound": 404,
    "Exists": 409,
    "Timeout": 504,
    "TooLarge": 413,
    "Busy": 503,
}
UNRESPONSIVE = "unresponsive: "  # how a sandbox's ``error`` starts while its agent is silent
Check = Callable[[dict[str, Any]], Any]  # a reply check of sandfork.engine.replies


@dataclass
class Live:
    """A running sandbox: its record, its backend instance, its code runner and the engine's
    end of its egress channel."""

    record: SandboxRecord
    instance: Instance
    runner: CodeRunner
    egress: EgressTunnel | None = None

    async def detach(self) -> None:
        """Close the engine's links to the sandbox (it keeps running)."""
        if self.egress is not None:
            await self.egress.close()
        await self.instance.agent.close()

    async def destroy(self) -> None:
        """Close the links and stop the sandbox."""
        if self.egress is not None:
            await self.egress.close()
        await self.instance.destroy()

    async def request(
        self, op: str, args: dict[str, Any] | None, check: Check, agent_timeout: float
    ) -> Any:
        """One request to the guest agent (its deadline: the op's own plus
        ``agent_timeout``), its reply checked by ``check``, failures mapped by
        :func:`agent_failures`."""
        with agent_failures(self.record):
            result = await self.instance.agent.request(
                op, args, wait=default_wait(op, agent_timeout)
            )
            return check(result)


@contextlib.contextmanager
def agent_failures(record: SandboxRecord) -> Iterator[None]:
    """Map the agent's errors to API errors: its own by type, a lost connection as a 409,
    no answer within the deadline as a 504 (and the sandbox's ``error`` says unresponsive
    until its agent answers again), a reply that breaks the protocol or an error of a type
    with no status of its own (the agent's ``Internal``, which guest code can forge) as a
    502, never a 500."""
    try:
        yield
    except TimeoutError as e:
        record.error = f"{UNRESPONSIVE}{e}"
        raise Unresponsive(f"sandbox {record.id} is unresponsive: {e}") from e
    except AgentUnavailable as e:
        raise Conflict(f"sandbox {record.id} did not answer: {e}") from e
    except AgentBadReply as e:
        _answered(record)
        raise BadReply(f"the guest agent of sandbox {record.id} sent an invalid reply: {e}") from e
    except AgentErrorReply as e:
        _answered(record)
        status = _AGENT_ERROR_STATUS.get(e.type)
        if status is None:  # "Internal" and the like: the guest failed, not the engine
            message = f"the guest agent of sandbox {record.id} failed: {e.message}"
            raise ApiError(message, 502) from e
        raise ApiError(e.message, status) from e
    _answered(record)


def _answered(record: SandboxRecord) -> None:
    if record.error is not None and record.error.startswith(UNRESPONSIVE):
        record.error = None
