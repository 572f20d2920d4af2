"""The TypeScript SDK (typescript-sdk/): its wire types and its Node test-runner tests.

The committed JSON schema (typescript-sdk/src/wire-schema.json) must be what
``python -m sandfork.protocol.schema`` prints, the generated src/wire.ts what the schema gives
and the SDK type-check against it (``npm run check:wire``), its routes the protocol's. The
package is installed from its lockfile and built once per session; the tests
(typescript-sdk/test/*.test.mjs) then run with ``node --test`` against the session's engine
and real VMs, and must leave no sandbox behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.protocol import routes

pytestmark = pytest.mark.any_backend  # above the backend: runs once (on containers where they run)
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
def built_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """typescript-sdk/ installed from package-lock.json (npm ci) and built (ESM, CJS, .d.ts),
    once per test run: the suite's workers (pytest-xdist) share the run's temporary root,
    where the first to build leaves a mark the others wait for."""
    run = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run = run.parent  # .../pytest-N/popen-gwK: the run's, shared by its workers
    with (run / "typescript-sdk.lock").open("a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not (run / "typescript-sdk.built").exists():
            _build()
            (run / "typescript-sdk.built").touch()
    for built in ("dist/esm/index.js", "dist/esm/index.d.ts", "dist/cjs/index.js"):
        assert (PACKAGE / built).is_file(), f"the build did not write {built}"
    return PACKAGE


def _build() -> None:
    cache = Path(os.environ.get("SANDFORK_CACHE_DIR", Path.home() / ".cache" / "sandfork"))
    env = {**os.environ, "npm_config_cache": str(cache / "npm")}
    npm = _tool("npm")
    _check(_run([npm, "ci", "--no-audit", "--no-fund"], env, 600), "npm ci")
    _check(_run([npm, "run", "build"], env, 300), "npm run build")


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


def test_the_committed_wire_schema_is_the_protocols() -> None:
    """typescript-sdk/src/wire-schema.json is what ``python -m sandfork.protocol.schema``
    prints: the TypeScript SDK's types are made from the protocol as it is."""
    result = subprocess.run(
        [sys.executable, "-m", "sandfork.protocol.schema"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    committed = (PACKAGE / "src" / "wire-schema.json").read_text()
    assert json.loads(committed) == json.loads(result.stdout), (
        "typescript-sdk/src/wire-schema.json is stale: run `python -m sandfork.protocol.schema"
        " > typescript-sdk/src/wire-schema.json`, then `npm run wire` in typescript-sdk"
    )
    assert committed == result.stdout, "wire-schema.json: same schema, other text; regenerate it"


def test_wire_types_are_the_schemas_and_type_check(built_package: Path) -> None:
    """``npm run check:wire``: src/wire.ts is what the schema gives, and ``tsc --noEmit``
    passes (the SDK's handles are checked against the generated types)."""
    env = dict(os.environ)
    _check(_run([_tool("npm"), "run", "check:wire"], env, 300), "npm run check:wire")


def test_the_sdk_routes_are_the_protocols(built_package: Path) -> None:
    """typescript-sdk/src/routes.ts spells the same paths and actions as
    ``sandfork.protocol.routes``."""
    script = (
        "import('@sandfork/sdk').then(({ routes: r }) => console.log(JSON.stringify({"
        " constants: [r.API, r.HEALTH, r.CHANGES, r.TEMPLATES, r.SANDBOXES, r.SNAPSHOTS,"
        " r.SNAPSHOT_IMPORT], sandbox: r.SANDBOX_ACTIONS, context: r.CONTEXT_ACTIONS,"
        " snapshot: r.SNAPSHOT_ACTIONS, paths: [r.sandbox('s b', 'exec'),"
        " r.context('s', 'c', 'run'), r.port('s', 8080), r.snapshot('p', 'export'),"
        " r.attachment('p', 'inventory.json')] })))"
    )
    result = _run([_tool("node"), "-e", script], dict(os.environ), 60)
    _check(result, "node")
    ts = json.loads(result.stdout)
    assert ts == {
        "constants": [
            routes.API,
            routes.HEALTH,
            routes.CHANGES,
            routes.TEMPLATES,
            routes.SANDBOXES,
            routes.SNAPSHOTS,
            routes.SNAPSHOT_IMPORT,
        ],
        "sandbox": sorted(routes.SANDBOX_ACTIONS),
        "context": sorted(routes.CONTEXT_ACTIONS),
        "snapshot": sorted(routes.SNAPSHOT_ACTIONS),
        "paths": [
            routes.sandbox("s b", "exec"),
            routes.context("s", "c", "run"),
            routes.port("s", 8080),
            routes.snapshot("p", "export"),
            routes.attachment("p", "inventory.json"),
        ],
    }


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
