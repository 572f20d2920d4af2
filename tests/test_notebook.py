"""nbclient runs a notebook on the Sandfork kernel; its outputs match a local ipykernel's."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest
from jupyter_client.asynchronous.client import AsyncKernelClient
from nbclient import NotebookClient
from nbformat import NotebookNode

from conftest import EngineProcess

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]

_CELLS = [
    "print('hello from the notebook')",
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
    "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})",
    "1 / 0",
    "name = input('name? ')\nprint('hello', name)",
    "import ipywidgets as widgets\nslider = widgets.IntSlider(value=3)\nslider",
    "print(slider.value)",
]
_WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(autouse=True)
def engine_env(engine: EngineProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SANDFORK_API", engine.url)
    monkeypatch.setenv("SANDFORK_API_KEY", engine.api_key)
    yield


class _InteractiveClient(NotebookClient):
    """A notebook client that answers ``input()`` and moves the slider like a frontend."""

    answers: list[str]

    async def answer_stdin(self, kc: AsyncKernelClient) -> None:
        while True:
            msg = await kc.get_stdin_msg()
            if msg["msg_type"] == "input_request":
                kc.input(self.answers.pop(0))

    def move_slider(self, model_id: str, value: int) -> None:
        """What a frontend sends when the user drags the slider: a comm update."""
        assert self.kc is not None
        content = {
            "comm_id": model_id,
            "data": {"method": "update", "state": {"value": value}, "buffer_paths": []},
        }
        self.kc.shell_channel.send(self.kc.session.msg("comm_msg", content))


async def _run(kernel_name: str) -> NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A notebook")]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in _CELLS]
    client = _InteractiveClient(nb, kernel_name=kernel_name, allow_errors=True, timeout=120)
    client.answers = ["sandfork"]
    async with client.async_setup_kernel():
        assert client.kc is not None
        client.kc.allow_stdin = True
        stdin = asyncio.ensure_future(client.answer_stdin(client.kc))
        try:
            for index, cell in enumerate(nb.cells):
                await client.async_execute_cell(cell, index)
                widget = [o for o in cell.get("outputs", []) if _WIDGET in o.get("data", {})]
                if widget:
                    client.move_slider(widget[0]["data"][_WIDGET]["model_id"], 7)
        finally:
            stdin.cancel()
    return nb


def _normalized(output: NotebookNode) -> dict[str, Any]:
    """An output without what differs between runs (ids, image bytes, execution counts)."""
    kind = output["output_type"]
    if kind == "stream":
        return {"type": kind, "name": output["name"], "text": output["text"]}
    if kind == "error":
        return {"type": kind, "ename": output["ename"], "evalue": output["evalue"]}
    data = output["data"]
    kept = {mime: value for mime, value in data.items() if mime in ("text/plain", "text/html")}
    return {"type": kind, "mimes": sorted(data), **kept}


def test_notebook_outputs_match_a_local_ipykernel() -> None:
    sandboxed = asyncio.run(_run("sandfork"))
    local = asyncio.run(_run("python3"))
    for ours, theirs in zip(sandboxed.cells, local.cells, strict=True):
        assert [_normalized(o) for o in ours.get("outputs", [])] == [
            _normalized(o) for o in theirs.get("outputs", [])
        ], ours.source
    outputs = [cell.get("outputs", []) for cell in sandboxed.cells]
    assert outputs[1][0]["text"] == "hello from the notebook\n"
    png = base64.b64decode(outputs[2][0]["data"]["image/png"])
    assert png.startswith(b"\x89PNG")
    assert "<table" in outputs[3][0]["data"]["text/html"]
    assert outputs[4][0]["ename"] == "ZeroDivisionError"
    assert outputs[5][-1]["text"].endswith("hello sandfork\n")
    assert _WIDGET in outputs[6][0]["data"]
    assert outputs[7][0]["text"] == "7\n"  # the frontend's comm update reached the guest
