"""The TypeScript SDK (typescript-sdk/): its Node test-runner tests against a real engine.

The package is installed from its lockfile and built once per session; the tests
(typescript-sdk/test/*.test.mjs) then run with ``node --test`` against the session's engine
and real VMs, and must leave no sandbox behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import EngineProcess

PACKAGE = Path(__file__).resolve().parent.parent / "typescript-sdk"
VENV_BIN = Path(__file__).resolve().parent.parent / ".venv" / "bin"


def _tool(name: str) -> str:
    """``node``/``npm`` as scripts/setup.sh arranges them: .venv/bin first, then PATH."""
    found = shutil.which(name, path=str(VENV_BIN)) or shutil.which(name)
    if found is None:
        pytest.fail(f"the TypeScript SDK tests need {name} (Node.js >= 20) on PATH")
    return found


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    # npm's script starts with "#!/usr/bin/env node": the node found must come first on PATH.
    path = f"{Path(_tool('node')).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        cmd,
        cwd=PACKAGE,
        env={**env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        print(result.stdout)
        print(result.stderr)
        pytest.fail(f"{what} exited with code {result.returncode}")


@pytest.fixture(scope="session")
def built_package() -> Path:
    """typescript-sdk/ installed from package-lock.json (npm ci) and built (ESM, CJS, .d.ts)."""
    cache = Path(os.environ.get("SANDFORK_CACHE_DIR", Path.home() / ".cache" / "sandfork"))
    env = {**os.environ, "npm_config_cache": str(cache / "npm")}
    npm = _tool("npm")
    _check(_run([npm, "ci", "--no-audit", "--no-fund"], env, 600), "npm ci")
    _check(_run([npm, "run", "build"], env, 300), "npm run build")
    for built in ("dist/esm/index.js", "dist/esm/index.d.ts", "dist/cjs/index.js"):
        assert (PACKAGE / built).is_file(), f"the build did not write {built}"
    return PACKAGE


def test_commonjs_and_esm_entry_points(built_package: Path) -> None:
    """``require`` and ``import`` of the package give the same API."""
    script = (
        "const cjs = require('@sandfork/sdk');"
        "import('@sandfork/sdk').then((esm) => {"
        "  const names = (m) => Object.keys(m).filter((k) => k !== 'default').sort().join();"
        "  if (names(cjs) !== names(esm)) process.exit(1);"
        "  if (typeof cjs.Sandbox.create !== 'function') process.exit(2);"
        "  console.log(names(esm));"
        "});"
    )
    result = _run([_tool("node"), "-e", script], dict(os.environ), 60)
    _check(result, "node")
    exported = result.stdout.strip().split(",")
    for name in ("Client", "Sandbox", "ReplayMismatch", "explore", "workflow", "AuthError"):
        assert name in exported


@pytest.mark.vm
def test_node_test_runner_against_the_engine(built_package: Path, engine: EngineProcess) -> None:
    """Documents 000 and 003, streaming, the workflow builder and explore, on real VMs."""
    before = engine.sandbox_ids()
    tests = sorted(
        str(p.relative_to(built_package)) for p in (built_package / "test").glob("*.test.mjs")
    )
    assert len(tests) >= 4, tests
    env = {
        **os.environ,
        "SANDFORK_API": engine.url,
        "SANDFORK_API_KEY": engine.api_key,
        "NODE_OPTIONS": "",
    }
    for name in ("PANDASTACK_API", "PANDASTACK_API_KEY"):
        env.pop(name, None)
    cmd = [_tool("node"), "--test", "--test-concurrency=1", "--test-reporter=tap", *tests]
    result = _run(cmd, env, 900)
    _check(result, "node --test")
    assert "# fail 0" in result.stdout, result.stdout
    assert engine.sandbox_ids() - before == set(), "the Node tests left sandboxes running"
