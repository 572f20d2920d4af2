"""The ``sandfork`` command as people and scripts see it: run as a subprocess.

Expected failures print ``sandfork: error: ...`` and a ``hint:`` and no traceback (``--debug``
shows it); every ``ls`` has ``--json``; tables never cut ids, however narrow the terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.sdk import Client, Sandbox


def sandfork(
    *args: str, env: dict[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m sandfork ARGS`` with ``env`` added to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "sandfork", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=check,
    )


def assert_one_line_failure(result: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit code 1, ``sandfork: error: <message...>`` and a hint, no traceback."""
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"sandfork: error: {message}"), result.stderr
    assert lines[-1].startswith("hint: "), result.stderr


def test_unknown_template_is_one_line_with_a_hint() -> None:
    result = sandfork("template", "build", "no-such-template")
    assert_one_line_failure(result, "unknown template 'no-such-template'")
    assert len(result.stderr.strip().splitlines()) == 2


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(where: str) -> None:
    args = ["template", "build", "no-such-template"]
    result = sandfork(*(["--debug", *args] if where == "before" else [*args, "--debug"]))
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert "TemplateError: unknown template" in result.stderr


def test_missing_qemu_is_reported_with_a_hint(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    result = sandfork("doctor", env={"PATH": str(empty_bin)})
    assert result.returncode == 1
    assert "qemu-system-x86_64 not installed" in result.stdout
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("hint: ")


def test_bad_engine_setting_is_one_line() -> None:
    result = sandfork("serve", env={"SANDFORK_PORT": "eighty"})
    assert_one_line_failure(result, "SANDFORK_PORT='eighty'")


def test_usage_error_exits_2() -> None:
    result = sandfork("sandbox", "ls", "--no-such-option")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_template_ls_json() -> None:
    templates = json.loads(sandfork("template", "ls", "--json", check=True).stdout)
    assert "code-interpreter" in {t["name"] for t in templates}


@pytest.fixture
def engine_env(engine: EngineProcess) -> dict[str, str]:
    """The environment pointing the CLI at the session's engine."""
    return {"SANDFORK_API": engine.url, "SANDFORK_API_KEY": engine.api_key}


@pytest.fixture
def sandbox(client: Client) -> Iterator[Sandbox]:
    """A sandbox of the session's engine, killed after the test."""
    sb = Sandbox.create("code-interpreter", client=client)
    try:
        yield sb
    finally:
        sb.kill()


@pytest.mark.vm
def test_ls_json_has_full_ids(sandbox: Sandbox, engine_env: dict[str, str]) -> None:
    sandboxes = json.loads(sandfork("sandbox", "ls", "--json", env=engine_env, check=True).stdout)
    listed = {item["id"]: item for item in sandboxes}
    assert listed[sandbox.id]["template"] == "code-interpreter"
    snapshots = json.loads(sandfork("snapshot", "ls", "--json", env=engine_env, check=True).stdout)
    assert isinstance(snapshots, list)


@pytest.mark.vm
def test_ls_never_cuts_ids(sandbox: Sandbox, engine_env: dict[str, str]) -> None:
    narrow = {**engine_env, "COLUMNS": "40"}
    out = sandfork("sandbox", "ls", env=narrow, check=True).stdout
    assert sandbox.id in out, out


def test_unknown_sandbox_is_one_line(engine_env: dict[str, str]) -> None:
    result = sandfork("sandbox", "kill", "sbx_0000000000000000", env=engine_env)
    assert_one_line_failure(result, "")
    assert "sandbox ls" in result.stderr
