"""The engine's link finds an agent that is slow to answer (a loaded machine, a guest under
TCG, an engine adopting its sandboxes after a restart): each ping waits longer than the last,
so a guest whose every answer comes after the first ping's wait is still reached. With a
fixed 0.5 s wait such a guest was never reached, and an adopted sandbox was reported dead."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from sandfork.backends.agent_link import AgentLink, AgentUnavailable

SLOW_ANSWER_S = 0.8  # longer than the first ping's wait (0.5 s)


@pytest_asyncio.fixture
async def slow_agent(tmp_path: Path) -> AsyncIterator[Path]:
    """A guest agent's port whose every answer to a ping takes ``SLOW_ANSWER_S``."""
    path = tmp_path / "agent.sock"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            request = json.loads(line)
            await asyncio.sleep(SLOW_ANSWER_S)  # one request at a time, as a busy guest
            result = {"version": "slow", "boot_id": "1", "uptime_s": 0, "pid": 1}
            writer.write(json.dumps({"id": request["id"], "ok": True, "result": result}).encode())
            writer.write(b"\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(serve, str(path))
    try:
        yield path
    finally:
        server.close()


@pytest.mark.asyncio
async def test_an_agent_slower_than_the_first_ping_wait_is_reached(slow_agent: Path) -> None:
    link = AgentLink(str(slow_agent))
    try:
        await link.connect(timeout=60.0)  # a bound for a hang, not a speed
        assert (await link.request("ping", wait=60.0))["version"] == "slow"
    finally:
        await link.close()


@pytest.mark.asyncio
async def test_an_agent_that_never_answers_is_given_up_at_the_deadline(tmp_path: Path) -> None:
    path = tmp_path / "silent.sock"

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes every ping, answers none

    server = await asyncio.start_unix_server(silent, str(path))
    link = AgentLink(str(path))
    try:
        with pytest.raises(AgentUnavailable, match="did not answer within 2 s"):
            await link.connect(timeout=2.0)
    finally:
        await link.close()
        server.close()
