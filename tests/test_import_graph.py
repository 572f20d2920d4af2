"""The clients (SDK, proxy kernel, server extension, the engine client) import no engine
internals: what they share with the engine lives in :mod:`sandfork.protocol`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sandfork

PACKAGE = Path(sandfork.__file__).parent
CLIENTS = ("sdk", "proxy_kernel", "jupyter", "client", "protocol", "gateway")
ENGINE_INTERNALS = ("sandfork.engine", "sandfork.backends", "sandfork.templates")
SHARED = ("paths.py", "strict_json.py")  # what clients and the engine share, beside protocol


def imported_modules(path: Path, package: str | None = None) -> list[tuple[int, str]]:
    """Every module ``path`` (of ``package``, else where it lies in sandfork) imports, as
    absolute names (relative ones resolved), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    if package is None:
        package = ".".join(("sandfork", *path.relative_to(PACKAGE).parent.parts))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.append((node.lineno, base))
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def is_internal(module: str) -> bool:
    """True for a module of the engine's own (or under it)."""
    return any(module == m or module.startswith(m + ".") for m in ENGINE_INTERNALS)


def client_modules() -> list[Path]:
    """Every module of the client packages, and the shared ones they use."""
    paths = [p for name in CLIENTS for p in sorted((PACKAGE / name).rglob("*.py"))]
    return [*paths, *(PACKAGE / name for name in SHARED)]


@pytest.mark.parametrize("path", client_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_client_module_imports_no_engine_internals(path: Path) -> None:
    bad = [f"line {line}: {name}" for line, name in imported_modules(path) if is_internal(name)]
    assert not bad, f"{path.relative_to(PACKAGE)} imports engine internals: {bad}"


def test_the_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The rule itself: absolute, from-, aliased and relative imports of the engine count."""
    module = tmp_path / "probe.py"
    module.write_text(
        "import sandfork.engine.db\n"
        "from sandfork.backends import base\n"
        "from sandfork import templates\n"
        "from ..engine import errors\n"
        "from sandfork.protocol import SNAPSHOT_ID\n"
        "def f():\n    import sandfork.engine.snapshots as s\n"
    )
    flagged = {line for line, name in imported_modules(module, "sandfork.sdk") if is_internal(name)}
    assert flagged == {1, 2, 3, 4, 7}


@pytest.mark.parametrize(
    "path",
    [*sorted((PACKAGE / "protocol").glob("*.py")), PACKAGE / "strict_json.py"],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_shared_rules_import_nothing_else_of_sandfork(path: Path) -> None:
    names = [name for _, name in imported_modules(path)]
    outside = [
        n for n in names if n.startswith("sandfork") and not n.startswith("sandfork.protocol")
    ]
    assert not outside, outside
