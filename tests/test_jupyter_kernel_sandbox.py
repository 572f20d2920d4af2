"""The server extension finds a kernel's sandbox by asking the kernel (its
``kernel_info_reply``'s ``"sandfork"``), wherever the kernel's connection file is, and follows
it onto another sandbox. A real Jupyter Server, real kernels and a real engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import EngineProcess
from jupyter_server_fixtures import (  # noqa: F401 (fixtures, found by name)
    Fetch,
    attached,
    call,
    jp_server_config,
    kernels_shut_down_after_the_test,
    run,
    start_session,
)
from sandfork.sdk import Snapshot

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]

# A kernel launcher that moves the connection file the server wrote into another directory
# and runs the module named first on it there (as a kernel on another host would have it).
MOVE_AND_RUN = (
    "import os, shutil, sys; module, connection, folder = sys.argv[1:]; "
    "moved = shutil.move(connection, folder); "
    "os.execv(sys.executable, [sys.executable, '-m', module, '-f', moved])"
)


async def test_the_kernels_sandbox_is_found_wherever_its_connection_file_is(
    jp_fetch: Fetch, jp_serverapp: Any, jp_data_dir: Path, tmp_path: Path, engine: EngineProcess
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv = [sys.executable, "-c", MOVE_AND_RUN, "sandfork.proxy_kernel", "{connection_file}"]
    spec = {
        "argv": [*argv, str(elsewhere)],
        "display_name": "Sandfork, moved",
        "language": "python",
    }
    (jp_data_dir / "kernels" / "sandfork-moved").mkdir()
    (jp_data_dir / "kernels" / "sandfork-moved" / "kernel.json").write_text(json.dumps(spec))
    kernel = await start_session(jp_fetch, "moved.ipynb", "sandfork-moved")
    info = await attached(jp_fetch, kernel)
    first = info["sandbox"]["id"]
    connection_file = Path(jp_serverapp.kernel_manager.get_kernel(kernel).connection_file)
    assert not connection_file.exists()
    assert (elsewhere / connection_file.name).exists()
    status, listing = await call(jp_fetch, "GET", "sandfork/api/snapshots")
    assert status == 200
    assert {s["id"]: s["kernel_id"] for s in listing["sandboxes"]}.get(first) == kernel

    # The kernel moves onto another sandbox: the server follows.
    snapshot = (await run(jp_serverapp, kernel, "%snapshot")).strip()
    restored = await run(jp_serverapp, kernel, f"%restore {snapshot}")
    assert restored.startswith(f"restored {snapshot} into "), restored
    now = restored.split()[-1]
    status, info = await call(jp_fetch, "GET", f"sandfork/api/kernels/{kernel}")
    assert status == 200 and info["sandbox"]["id"] == now != first
    Snapshot.get(snapshot, engine.client()).delete()
