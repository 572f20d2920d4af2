"""The guest agent's own bounds (run on the host, no VM): what it reads, and what it runs."""

# ruff: noqa: F811  (the tests take the fixtures imported from test_agent as arguments)

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agent_client import AgentClient
from test_agent import agent, client  # noqa: F401  (the agent on the host, a connection)

MAX = 1 << 20


@pytest.mark.asyncio
async def test_reads_are_bounded(client: AgentClient, tmp_path: Path) -> None:
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(400 << 20)  # sparse: 400 MB that cost nothing to make
    reply = await client.call("fs.read", path=str(big), max_bytes=MAX)
    assert reply.error_type == "TooLarge", reply
    assert "offset" in reply.frame["error"]["message"]
    part = await client.request("fs.read", path=str(big), offset=300 << 20, length=16)
    assert part["size"] == 16
    small = tmp_path / "small"
    small.write_bytes(b"x" * MAX)
    assert (await client.request("fs.read", path=str(small), max_bytes=MAX))["size"] == MAX
    over = await client.call("fs.read", path=str(small), length=MAX + 1, max_bytes=MAX)
    assert over.error_type == "TooLarge"


@pytest.mark.asyncio
async def test_devices_and_pipes_are_never_read_unbounded(
    client: AgentClient, tmp_path: Path
) -> None:
    zero = await client.call("fs.read", path="/dev/zero", max_bytes=MAX)
    assert (
        zero.error_type == "BadRequest" and "not a regular file" in zero.frame["error"]["message"]
    )
    ranged = await client.request("fs.read", path="/dev/zero", length=8, max_bytes=MAX)
    assert ranged["size"] == 8 and ranged["data"] == "AAAAAAAAAAA="
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it blocking would wait for a writer forever
    reply = await client.call("fs.read", path=str(fifo), length=8, wait=10)
    assert reply.error_type == "BadRequest" and "pipe" in reply.frame["error"]["message"]
    proc_file = await client.request("fs.read", path="/proc/self/status", max_bytes=MAX)
    assert proc_file["size"] > 0  # /proc says size 0: read anyway, still capped


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "args",
    [
        {"cmd": "true\x00; echo x"},
        {"cmd": "true", "env": {"A=B": "x"}},
        {"cmd": "true", "env": {"": "x"}},
        {"cmd": "true", "env": {"A": "x\x00y"}},
        {"cmd": "true", "env": {"A\x00": "x"}},
        {"cmd": "true", "cwd": "/tmp\x00/x"},
    ],
)
async def test_exec_arguments_no_process_can_take_are_bad_requests(
    client: AgentClient, args: dict[str, Any]
) -> None:
    reply = await client.call("exec", **args)
    assert reply.error_type == "BadRequest", reply


@pytest.mark.asyncio
async def test_fs_paths_with_nul_are_bad_requests(client: AgentClient) -> None:
    for op in ("fs.read", "fs.stat", "fs.list", "fs.delete"):
        assert (await client.call(op, path="/tmp/\x00x")).error_type == "BadRequest", op
