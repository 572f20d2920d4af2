"""JupyterLab with the Sandfork extensions, driven in headless Chromium through Playwright.

The issue's acceptance: a notebook on the Sandfork kernel runs ``x = 41``; *Snapshot*;
``x += 1``; *Restore…* opens a new notebook where ``x`` is 41 while the original's is 42;
*Fork* opens a branch notebook holding ``x``. The launcher shows the kernelspec's logo; the
buttons are notebook toolbar items from the settings, in the order the user's settings give.
Screenshots of the launcher, the toolbar and the side panel go to ``artifacts/``.
"""

from __future__ import annotations

import contextlib
import re
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
    start_lab,
)
from jupyterlab_fixtures import notebook_panel as _notebook
from jupyterlab_fixtures import run_cell as _run_cell
from jupyterlab_fixtures import tab as _tab
from jupyterlab_fixtures import toolbar_button as _toolbar_button
from jupyterlab_fixtures import wait_for_notebook as _wait_for_notebook

pytestmark = [pytest.mark.vm, pytest.mark.portable]

SERVER_MAX_BRANCHES = 4  # c.SandforkExtension.max_branches: caps the user's setting below
USER_SETTINGS = {
    # Every fork asks for confirmation (more branches than 0).
    "@sandfork/jupyterlab/plugin": {"maxBranches": 6, "confirmForkAbove": 0},
    # The notebook toolbar's own settings place the Sandfork items: Restore… moves after Fork.
    "@jupyterlab/notebook-extension/panel": {"toolbar": [{"name": "sandfork-restore", "rank": 63}]},
}


@pytest.fixture
def lab(own_engine: EngineProcess, tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab on an engine of its own (the side panel lists every snapshot of the engine:
    other tests' stay out)."""
    args = [f"--SandforkExtension.max_branches={SERVER_MAX_BRANCHES}"]
    with start_lab(own_engine, tmp_path, USER_SETTINGS, args) as lab:
        yield lab


def _print_x(page: Page) -> str:
    cell = _run_cell(page, "print(x)")
    output = cell.locator(".jp-OutputArea-output")
    expect(output).to_have_count(1)
    return output.inner_text().strip()


def _accept_dialog(page: Page) -> None:
    page.locator(".jp-Dialog .jp-mod-accept").click()
    expect(page.locator(".jp-Dialog")).to_have_count(0)


def _fork_one_branch(page: Page) -> None:
    """Answers Fork's dialogs: one branch (the default), then yes to the confirmation."""
    page.locator(".jp-Dialog .jp-mod-accept").click()
    confirmation = page.locator(".jp-Dialog", has_text=re.compile(r"into 1 branch notebook\?"))
    expect(confirmation).to_be_visible()
    _accept_dialog(page)


@contextlib.contextmanager
def _showing_the_listing_on_failure(lab: Lab) -> Iterator[None]:
    """A failed check of the panel also shows what the server lists now."""
    try:
        yield
    except AssertionError as e:
        listing = lab.api("GET", "sandfork/api/snapshots")
        raise AssertionError(f"{e}\nthe server lists now: {listing}") from e


def _sessions_by_path(lab: Lab) -> dict[str, list[dict[str, Any]]]:
    sessions: dict[str, list[dict[str, Any]]] = {}
    for session in lab.api("GET", "api/sessions"):
        sessions.setdefault(session["path"], []).append(session)
    return sessions


def test_snapshot_restore_and_fork_from_jupyterlab(
    lab: Lab, page: Page, own_engine: EngineProcess
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    progress_polls: list[int] = []  # statuses of the front end's progress polls
    page.on(
        "response",
        lambda r: progress_polls.append(r.status) if "/sandfork/api/operations/" in r.url else None,
    )
    card = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="(Sandfork)")
    # The kernel's card shows the kernelspec's logo, not the initial it falls back to.
    logo = card.locator("img.jp-Launcher-kernelIcon")
    expect(logo).to_have_attribute("src", re.compile(r"/kernelspecs/sandfork/logo-svg\.svg"))
    expect(logo).to_have_js_property("naturalWidth", 64)  # loaded and drawn: the SVG's width
    expect(card.locator(".jp-LauncherCard-noKernelIcon")).to_have_count(0)
    page.locator(".jp-Launcher").screenshot(path=ARTIFACTS / "jupyterlab-launcher.png")
    resources = lab.api("GET", "api/kernelspecs")["kernelspecs"]["sandfork"]["resources"]
    assert {"logo-svg", "logo-32x32", "logo-64x64"} <= resources.keys(), resources
    card.click()
    _wait_for_notebook(page, "Untitled.ipynb")
    # The buttons are toolbar items from the settings: after the cell type, before the spacer,
    # in the order of the user's notebook toolbar settings.
    items = _notebook(page).locator(".jp-NotebookPanel-toolbar [data-jp-item-name]")
    names = items.evaluate_all("nodes => nodes.map(node => node.dataset.jpItemName)")
    sandfork = [name for name in names if name.startswith("sandfork-")]
    assert sandfork == [
        "sandfork-snapshot",
        "sandfork-fork",
        "sandfork-restore",
        "sandfork-checkpoints",
        "sandfork-hibernated",
    ], names
    assert names.index("cellType") < names.index(sandfork[0]), names
    assert names.index(sandfork[-1]) < names.index("spacer"), names
    status = page.locator(".sandfork-StatusItem")
    expect(status).to_have_text(re.compile(r"(VM · (TCG|KVM)|Container) · \d+ (GiB|MiB)"))

    _run_cell(page, "x = 41")
    # With copy-on-write memory a snapshot can finish before the front end's first progress
    # poll (500 ms in): the engine holds the capture until the front end has polled.
    with own_engine.holding("snapshot.capture") as parked:
        _toolbar_button(page, "snapshot").click()
        page.locator(".jp-Dialog input").fill("x is 41")
        _accept_dialog(page)
        parked()
        if not progress_polls:
            polled = "/sandfork/api/operations/"
            page.wait_for_event("response", lambda r: polled in r.url, timeout=300_000)
    done = page.get_by_text(re.compile(r"Snapshot x is 41 \(snap_[0-9a-f]+\) taken"))
    expect(done).to_be_visible()
    [snapshot] = lab.api("GET", "sandfork/api/snapshots")["snapshots"]
    assert snapshot["name"] == "x is 41"
    assert snapshot["notebook_path"] == "Untitled.ipynb"

    _run_cell(page, "x += 1")
    _notebook(page).locator(".jp-NotebookPanel-toolbar").screenshot(
        path=ARTIFACTS / "jupyterlab-toolbar.png"
    )

    kernels_before = {k["id"] for k in lab.api("GET", "api/kernels")}
    _toolbar_button(page, "restore").click()
    expect(page.locator(".jp-Dialog select")).to_contain_text("x is 41")
    page.screenshot(path=ARTIFACTS / "jupyterlab-restore-dialog.png")
    _accept_dialog(page)
    _wait_for_notebook(page, "Untitled-restored-1.ipynb")
    assert _print_x(page) == "41"
    # The notebook joined the session the server made on the restored kernel: no other one.
    restored = _sessions_by_path(lab)["Untitled-restored-1.ipynb"]
    assert len(restored) == 1
    new_kernels = {k["id"] for k in lab.api("GET", "api/kernels")} - kernels_before
    assert new_kernels == {restored[0]["kernel"]["id"]}

    page.keyboard.press("Escape")  # command mode, where the shortcuts apply
    page.keyboard.press("Control+Alt+r")
    expect(page.locator(".jp-Dialog select")).to_contain_text("x is 41")
    page.locator(".jp-Dialog .jp-mod-reject").click()

    _tab(page, "Untitled.ipynb").click()
    _wait_for_notebook(page, "Untitled.ipynb")
    assert _print_x(page) == "42"

    _toolbar_button(page, "fork").click()
    # Branch counts up to the server's limit, which caps the user's higher setting.
    counts = [str(n) for n in range(1, SERVER_MAX_BRANCHES + 1)]
    expect(page.locator(".jp-Dialog select option")).to_have_text(counts)
    _fork_one_branch(page)
    _wait_for_notebook(page, "Untitled-branch-1.ipynb")
    assert _print_x(page) == "42"
    assert len(_sessions_by_path(lab)["Untitled-branch-1.ipynb"]) == 1

    page.locator('.jp-SideBar .lm-TabBar-tab[data-id="sandfork-snapshots"]').click()
    panel = page.locator("#sandfork-snapshots")
    with _showing_the_listing_on_failure(lab):
        expect(panel.locator(".sandfork-Tree-snapshot")).to_have_count(1)
        expect(panel.locator(".sandfork-Tree-sandbox")).to_have_count(3)
        expect(panel.locator('[data-action="fork"]')).to_have_count(3)
    assert 200 in progress_polls  # the notifications followed the operations' steps

    panel.locator('.sandfork-Tree-snapshot [data-action="rename"]').click()
    page.locator(".jp-Dialog input").fill("forty-one")
    _accept_dialog(page)
    expect(
        panel.locator(".sandfork-Tree-snapshot > .sandfork-Tree-row .sandfork-Tree-name")
    ).to_have_text("forty-one")
    # Fork from the side panel: the restored notebook's sandbox, restored from x = 41.
    [restored_sandbox] = [
        s
        for s in lab.api("GET", "sandfork/api/snapshots")["sandboxes"]
        if s["notebook_path"] == "Untitled-restored-1.ipynb"
    ]
    panel.locator(f'[data-id="{restored_sandbox["id"]}"] > .sandfork-Tree-row').locator(
        '[data-action="fork"]'
    ).click()
    _fork_one_branch(page)
    _wait_for_notebook(page, "Untitled-restored-1-branch-1.ipynb")
    assert _print_x(page) == "41"
    expect(panel.locator(".sandfork-Tree-sandbox")).to_have_count(4)
    panel.screenshot(path=ARTIFACTS / "jupyterlab-snapshots-panel.png")
    _tab(page, "Untitled-restored-1.ipynb").click()
    _wait_for_notebook(page, "Untitled-restored-1.ipynb")
    page.screenshot(path=ARTIFACTS / "jupyterlab.png")

    panel.locator('.sandfork-Tree-snapshot [data-action="delete"]').click()
    _accept_dialog(page)
    expect(panel.locator(".sandfork-Tree-snapshot")).to_have_count(0)
    assert lab.api("GET", "sandfork/api/snapshots")["snapshots"] == []

    # A notebook on another kernel has no Sandfork buttons nor status.
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-addButton").click()
    page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="ipykernel").click()
    expect(_tab(page, "Untitled1.ipynb")).to_have_class(re.compile(r"\blm-mod-current\b"))
    expect(_notebook(page).locator(".jp-Notebook-ExecutionIndicator")).to_have_attribute(
        "data-status", "idle"
    )
    expect(_notebook(page).locator('[data-jp-item-name^="sandfork-"]')).to_have_count(5)
    for name in ("snapshot", "restore", "fork"):
        expect(_toolbar_button(page, name)).to_be_hidden()
    expect(_notebook(page).locator(".sandfork-CheckpointsToggle")).to_be_hidden()
    expect(_notebook(page).locator(".sandfork-HibernatedIndicator")).to_be_hidden()
    expect(status).to_be_hidden()
