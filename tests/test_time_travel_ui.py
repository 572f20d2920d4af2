"""Time travel in JupyterLab, driven in headless Chromium through Playwright (issue 14's
acceptance): five cells with checkpoints on (the notebook's toolbar toggle); "Rewind kernel
to before this cell" on cell 3 (its context menu): a variable cell 4 made is gone, one from
cell 2 is there, and the cells from 3 on are marked not run; the side panel's graph shows
the checkpoints, a checkpoint's inventory shows the DataFrame's shape, and two selected
checkpoints show the changed variable; a notebook idle past a test-short time shows
"hibernated", its VM is gone, and running a cell wakes it with its variables. Screenshots of
the graph with a checkpoint's inventory, with a diff, and of the hibernated notebook go to
``artifacts/``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from conftest import EngineProcess
from jupyterlab_fixtures import (  # noqa: F401 (fixtures, found by name)
    ARTIFACTS,
    Lab,
    chromium,
    lab_page,
    notebook_panel,
    run_cell,
    start_lab,
    wait_for_notebook,
)

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]

CELLS = [
    "import pandas as pd",
    "df = pd.DataFrame({'a': range(5), 'b': range(5)})\nkept = 'from cell 2'",
    "df['c'] = df['a'] * 2",
    "made_by_4 = 4",
    "total = int(df['c'].sum())",
]


@pytest.fixture
def lab(own_engine: EngineProcess, tmp_path: Path) -> Iterator[Lab]:
    with start_lab(own_engine, tmp_path, {}, []) as lab:
        yield lab
    # A kernel stopped with the server may end before it kills its sandbox: its lease does
    # (that is what the lease is for). Wait for it before the engine is checked.
    deadline = time.monotonic() + 600  # a bound for a hang: the lease is 120 s
    while own_engine.sandbox_ids() and time.monotonic() < deadline:
        time.sleep(0.5)


def _kernel(lab: Lab) -> dict[str, Any]:
    (session,) = lab.api("GET", "api/sessions")
    return lab.api("GET", f"sandfork/api/kernels/{session['kernel']['id']}")  # type: ignore[no-any-return]


def _checkpoint_after(lab: Lab, lineage: str, count: int) -> str:
    """The first checkpoint of the kernel taken after execution ``count`` (the listing is
    newest first; after a rewind, a later cell may have the same count)."""
    for snapshot in reversed(lab.api("GET", "sandfork/api/snapshots")["snapshots"]):
        if snapshot["lineage"] == lineage and snapshot["execution_count"] == count:
            return str(snapshot["id"])
    raise AssertionError(f"no checkpoint after execution {count}")


def _widen_left_panel(page: Page, pixels: int) -> None:
    """Drag the handle between the left panel and the notebook (for a readable screenshot)."""
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first
    box = handle.bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + pixels, y, steps=5)
    page.mouse.up()


def _output(page: Page, code: str) -> str:
    cell = run_cell(page, code)
    output = cell.locator(".jp-OutputArea-output")
    expect(output).to_have_count(1)
    return output.inner_text().strip()


def test_checkpoints_rewind_inventory_and_hibernation_in_jupyterlab(
    own_engine: EngineProcess, lab: Lab, page: Page
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="(Sandfork)").click()
    wait_for_notebook(page, "Untitled.ipynb")

    toggle = notebook_panel(page).locator(".sandfork-CheckpointsToggle")
    expect(toggle).to_have_attribute("aria-pressed", "false")  # the setting's default: off
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    for _ in range(600):  # the kernel has applied it (and taken the first checkpoint)
        if _kernel(lab)["checkpoints"]:
            break
        page.wait_for_timeout(100)
    kernel = _kernel(lab)
    assert kernel["checkpoints"] is True, kernel

    cells = [run_cell(page, code) for code in CELLS]

    # Rewind to before cell 3, from its context menu.
    cells[2].locator(".jp-InputArea-prompt").click(button="right")
    page.locator(".lm-Menu-itemLabel", has_text="Rewind kernel to before this cell").click()
    for cell in cells[2:]:
        expect(cell).to_have_class(re.compile(r"\bsandfork-mod-notRun\b"))
    for cell in cells[:2]:
        expect(cell).not_to_have_class(re.compile(r"\bsandfork-mod-notRun\b"))
    found = _output(page, "print('made_by_4' in globals(), kept, df.shape)")
    assert found == "False from cell 2 (5, 2)"

    # The graph: the checkpoints of this notebook; the inventory and a diff of two of them.
    page.locator('.jp-SideBar .lm-TabBar-tab[data-id="sandfork-snapshots"]').click()
    _widen_left_panel(page, 200)
    lineage = _kernel(lab)["lineage"]
    after_2, after_3 = (_checkpoint_after(lab, lineage, n) for n in (2, 3))
    graph = page.locator("#sandfork-snapshots")
    nodes = graph.locator('.sandfork-Graph-node[data-kind="checkpoint"]')
    expect(nodes.first).to_be_visible()
    assert nodes.count() >= 6  # on, five cells, the print after the rewind
    expect(graph.locator(".sandfork-Graph-current")).to_have_count(1)
    graph.locator(f'.sandfork-Graph-node[data-id="{after_2}"]').click()
    row = graph.locator('.sandfork-Inventory [data-name="df"]')
    expect(row).to_contain_text("pandas.DataFrame")
    expect(row).to_contain_text(re.compile(r"5\s*\u00d7\s*2"))
    page.screenshot(path=ARTIFACTS / "jupyterlab-inventory.png")
    graph.locator(f'.sandfork-Graph-node[data-id="{after_3}"]').click(modifiers=["Shift"])
    changed = graph.locator('.sandfork-Diff [data-change="changed"]')
    expect(changed).to_have_count(1)
    expect(changed).to_have_attribute("data-name", "df")
    page.screenshot(path=ARTIFACTS / "jupyterlab-time-travel.png")

    # Idle past a test-short time: hibernated, its VM gone; a cell wakes it with its state.
    run_cell(page, "%hibernate after 3")
    sandbox_id = _kernel(lab)["sandbox"]["id"]
    status = page.locator(".sandfork-StatusItem")
    expect(status).to_contain_text("Hibernated", timeout=120_000)
    expect(notebook_panel(page).locator(".sandfork-HibernatedIndicator")).to_be_visible()
    assert own_engine.sandbox_gone(sandbox_id)
    page.screenshot(path=ARTIFACTS / "jupyterlab-hibernated.png")
    assert _output(page, "print(kept, df.shape)") == "from cell 2 (5, 2)"
    expect(status).to_have_text(re.compile(r"(VM · (TCG|KVM)|Container) · \d+ (GiB|MiB)"))
    assert _kernel(lab)["sandbox"]["id"] == sandbox_id  # woken under the same id
