"""Driving a Sandfork kernel as a notebook does, through jupyter_client (shared by the kernel
tests)."""

from __future__ import annotations

import time
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from conftest import EngineProcess
from sandfork.proxy_kernel.kernel_info import REQUEST, sandbox_of
from sandfork.sdk import Sandbox


def execute(
    kc: BlockingKernelClient, code: str, cell_id: str | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    """Run ``code`` (as the notebook cell ``cell_id``, if given); return its iopub messages
    and its reply last."""
    if cell_id is None:
        msg_id = kc.execute(code, **kwargs)
    else:  # as JupyterLab sends a cell: its id in the request's metadata
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}}
        msg = kc.session.msg("execute_request", content, metadata={"cellId": cell_id})
        kc.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
    reply = kc.get_shell_msg(timeout=120)
    while reply["parent_header"]["msg_id"] != msg_id:  # a late kernel_info_reply
        reply = kc.get_shell_msg(timeout=120)
    messages = []
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return [*messages, reply]


def stdout(messages: list[dict[str, Any]]) -> str:
    """What the messages of an execution printed."""
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
    )


def kernel_sandbox(km: KernelManager, timeout: float = 120) -> dict[str, Any]:
    """What the kernel of ``km`` says of its sandbox (its ``kernel_info_reply``'s
    ``"sandfork"``), asked on the control channel as the server extension asks; the answer
    comes once the kernel has attached."""
    kc = km.blocking_client()
    kc.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        msg = kc.session.msg(REQUEST)
        kc.control_channel.send(msg)
        while True:
            reply = kc.control_channel.get_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                found = sandbox_of(reply)
                assert found is not None, f"no sandbox in the kernel's info: {reply}"
                return found
    finally:
        kc.stop_channels()


def sandbox_id(km: KernelManager) -> str:
    """The sandbox the kernel of ``km`` runs in, as it says."""
    return str(kernel_sandbox(km)["sandbox_id"])


def wait_status(engine: EngineProcess, sandbox: str, status: str, seconds: float) -> None:
    """Wait until the engine lists ``sandbox`` with ``status``."""
    deadline = time.monotonic() + seconds
    while Sandbox.get(sandbox, engine.client()).status != status:
        assert time.monotonic() < deadline, f"sandbox {sandbox} is not {status}"
        time.sleep(0.25)
