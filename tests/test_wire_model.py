"""One wire model: each field, route and error kind is defined once, in ``sandfork.protocol``,
and every client follows it.

- a field added to the sandbox's model and the engine's record reaches both SDKs' parsed
  objects with no change to either SDK;
- no client module spells an API path (they build them with ``protocol.routes``);
- no import cycle in the Python package;
- every error of the clients survives pickling, kind and status included;
- the lab extension's settings take their defaults and bounds from the same limits.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandfork
from conftest import EngineProcess
from sandfork.protocol import (
    CHECKPOINTS_KEPT,
    ERROR_CLASSES,
    MAX_BRANCHES,
    MAX_CHECKPOINTS_KEPT,
    ErrorKind,
    SandboxInfo,
    error_for,
    routes,
)
from sandfork.sdk import CommandFailed, ReplayMismatch, Sandbox
from test_typescript_sdk import _tool, built_package  # noqa: F401 (a fixture)

PACKAGE = Path(sandfork.__file__).parent
REPO = PACKAGE.parent.parent
TS_SDK = REPO / "typescript-sdk"

# -- adding a field ---------------------------------------------------------------------------

# Run at the engine's start (a sitecustomize on its PYTHONPATH): the sandbox's model gains a
# field, and so does the engine's record; nothing else of the engine or the SDKs is touched.
ADD_A_FIELD = """
from dataclasses import dataclass

from sandfork.engine import db
from sandfork.protocol import SandboxInfo


@dataclass
class Zoned(SandboxInfo):
    zone: str = "lab-7"


Zoned.WIRE_BASE = Zoned


@dataclass
class ZonedRecord(db.SandboxRecord):
    zone: str = "lab-7"


ZonedRecord.WIRE_BASE = Zoned
db.SandboxRecord = ZonedRecord
"""


@pytest.fixture
def zoned_engine(tmp_path: Path, template: None) -> Iterator[EngineProcess]:
    """An engine whose sandboxes have one field more than this checkout's model."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(ADD_A_FIELD)
    (tmp_path / "home").mkdir()
    proc = EngineProcess(tmp_path / "home")
    proc.env["PYTHONPATH"] = f"{site}:{PACKAGE.parent}"
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


@pytest.mark.vm
@pytest.mark.any_backend
@pytest.mark.usefixtures("built_package")
def test_a_field_added_to_the_model_reaches_both_sdks(zoned_engine: EngineProcess) -> None:
    sandbox = Sandbox.create(client=zoned_engine.client())
    try:
        assert zoned_engine.get(routes.API + routes.sandbox(sandbox.id)).json()["zone"] == "lab-7"
        assert sandbox.extra == {"zone": "lab-7"}
        assert Sandbox.get(sandbox.id, client=zoned_engine.client()).extra["zone"] == "lab-7"
        assert Sandbox.from_api(sandbox.to_api()).extra == {"zone": "lab-7"}  # kept as sent
        assert _typescript_sees(zoned_engine, sandbox.id) == "lab-7"
    finally:
        sandbox.kill()


def _typescript_sees(engine: EngineProcess, sandbox_id: str) -> object:
    """The ``zone`` of the sandbox as the TypeScript SDK parses it."""
    script = textwrap.dedent(
        f"""
        import {{ Sandbox }} from "./dist/esm/index.js";
        const connection = {{ baseUrl: {json.dumps(engine.url)},
                              apiKey: {json.dumps(engine.api_key)}, autoStart: false }};
        const sandbox = await Sandbox.get({json.dumps(sandbox_id)}, {{ connection }});
        console.log(JSON.stringify({{ zone: sandbox.info.zone ?? null }}));
        """
    )
    done = subprocess.run(
        [_tool("node"), "--input-type=module", "-e", script],
        cwd=TS_SDK,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["zone"]


def test_the_model_keeps_what_it_does_not_know() -> None:
    data = {"id": "sbx_1", "template": "t", "status": "running", "cpu": 1, "memory_mb": 512}
    info = SandboxInfo.from_api({**data, "zone": "lab-7"})
    assert info.extra == {"zone": "lab-7"} and info.to_api()["zone"] == "lab-7"
    with pytest.raises(ValueError, match="status must be one of"):
        SandboxInfo.from_api({**data, "status": "sleeping"})
    with pytest.raises(ValueError, match="cpu must be an integer"):
        SandboxInfo.from_api({**data, "cpu": True})
    with pytest.raises(ValueError, match="needs 'memory_mb'"):
        SandboxInfo.from_api({k: v for k, v in data.items() if k != "memory_mb"})


# -- routes are spelled once ------------------------------------------------------------------

ROUTE = re.compile(r"""["'`](?:/v1)?/(?:sandboxes|snapshots|changes|templates|health)\b""")
PYTHON_CLIENTS = ("sdk", "proxy_kernel", "jupyter", "cli", "gateway")
TS_OWNERS = ("routes.ts",)  # where the TypeScript SDK builds its paths


def _python_strings(path: Path) -> Iterator[tuple[int, str]]:
    """Every string literal of ``path`` but docstrings, with its line (f-strings' parts too)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node.lineno, node.value


def _route_literals_in_python() -> list[str]:
    found = []
    for name in PYTHON_CLIENTS:
        for path in sorted((PACKAGE / name).rglob("*.py")):
            for line, text in _python_strings(path):
                if ROUTE.search(f'"{text}'):
                    found.append(f"{path.relative_to(PACKAGE)}:{line}: {text!r}")
    return found


def _route_literals_in_typescript() -> list[str]:
    found = []
    for path in sorted((TS_SDK / "src").glob("*.ts")):
        if path.name in TS_OWNERS:
            continue
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(), flags=re.S)
        found += [f"{path.name}: {m.group(0)!r}" for m in ROUTE.finditer(code)]
    return found


def test_no_client_module_spells_a_route() -> None:
    python, typescript = _route_literals_in_python(), _route_literals_in_typescript()
    assert not python, f"use sandfork.protocol.routes: {python}"
    assert not typescript, f"use typescript-sdk/src/routes.ts: {typescript}"


def test_the_route_check_sees_literals_and_f_strings(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        '"""Docs may say GET /v1/sandboxes."""\n'
        'a = "/sandboxes"\n'
        'b = f"/snapshots/{a}/export"\n'
        "c = '/v1/changes'\n"
        'd = "/sandboxesque"\n'
    )
    hits = sorted(line for line, text in _python_strings(module) if ROUTE.search(f'"{text}'))
    assert hits == [2, 3, 4]


def test_routes_quote_ids_and_refuse_unknown_actions() -> None:
    assert routes.sandbox("sbx_1", "fork-tree") == "/sandboxes/sbx_1/fork-tree"
    assert routes.context("sbx_1", "a/b", "run") == "/sandboxes/sbx_1/repl/sessions/a%2Fb/run"
    assert routes.snapshot("../x") == "/snapshots/..%2Fx"
    with pytest.raises(ValueError, match="no route"):
        routes.sandbox("sbx_1", "forks")


# -- no import cycles -------------------------------------------------------------------------


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module → the modules of the package it imports (anywhere in it: at the top, in a
    function, under TYPE_CHECKING)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    edges.add(target if target in modules else base)
        graph[name] = (edges & modules.keys()) - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while (top := stack.pop()) != module:
                component.append(top)
            if component:
                found.append(sorted([module, *component]))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_the_python_package_has_no_import_cycle() -> None:
    assert _cycles(_import_graph()) == []


def test_the_cycle_check_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_an_error_survives_pickling_with_its_kind_and_status(kind: ErrorKind) -> None:
    error = error_for(418, f"a {kind} went wrong", kind)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is ERROR_CLASSES[kind] and again.kind == kind
    assert (str(again), again.status) == (str(error), 418)


def test_the_sdks_own_errors_survive_pickling() -> None:
    failed = pickle.loads(
        pickle.dumps(CommandFailed("exit 3", exit_code=3, stdout="o", stderr="e"))
    )
    assert (str(failed), failed.exit_code, failed.stdout, failed.stderr) == ("exit 3", 3, "o", "e")
    mismatch = pickle.loads(pickle.dumps(ReplayMismatch(2, {"kind": "exec"}, {"kind": "x"})))
    assert (mismatch.seq, mismatch.expected, mismatch.got) == (2, {"kind": "exec"}, {"kind": "x"})


def test_an_answer_naming_no_kind_is_classed_by_its_status() -> None:
    assert type(error_for(404, "gone")) is ERROR_CLASSES[ErrorKind.NOT_FOUND]
    assert type(error_for(503, "busy")) is ERROR_CLASSES[ErrorKind.SERVER_ERROR]
    assert type(error_for(422, "no", "no-such-kind")) is ERROR_CLASSES[ErrorKind.BAD_REQUEST]


# -- the lab extension's settings -------------------------------------------------------------


def test_the_lab_settings_defaults_and_bounds_are_the_protocols() -> None:
    """JSON settings cannot import Python: a changed limit fails here until they follow."""
    schema = json.loads((REPO / "labextension" / "schema" / "plugin.json").read_text())
    settings = schema["properties"]
    assert settings["maxBranches"]["default"] == MAX_BRANCHES
    assert settings["checkpointsKept"]["default"] == CHECKPOINTS_KEPT
    assert settings["checkpointsKept"]["maximum"] == MAX_CHECKPOINTS_KEPT
