"""hatch-jupyter-builder's build function: the JupyterLab extension, built with npm.

``npm ci`` (only when node_modules does not match package-lock.json), then
``npm run build:prod``, which writes the prebuilt extension to ``build_dir``. Nothing runs
when that output is newer than every source, so reinstalls (editable or not) are fast.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCES = ("src", "style", "schema", "package.json", "package-lock.json", "tsconfig.json")


def _newest_mtime(path: Path) -> float:
    if path.is_file():
        return path.stat().st_mtime
    return max((p.stat().st_mtime for p in path.rglob("*") if p.is_file()), default=0.0)


def build(target_name: str, version: str, *, path: str, build_dir: str) -> None:
    """Builds the extension in ``path`` into ``build_dir`` unless it is up to date."""
    del target_name, version  # the same build serves wheels, sdists and editable installs
    source = Path(path).resolve()
    stamp = Path(build_dir).resolve() / "package.json"
    newest = max(_newest_mtime(source / name) for name in SOURCES)
    if stamp.exists() and stamp.stat().st_mtime >= newest:
        print(f"JupyterLab extension up to date in {build_dir}")
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "building the JupyterLab extension needs Node.js (>= 20.19) and npm on PATH: "
            "run scripts/setup.sh, or install them"
        )
    cache = Path(os.environ.get("SANDFORK_CACHE_DIR", Path.home() / ".cache" / "sandfork"))
    env = {"npm_config_cache": str(cache / "npm"), **os.environ}
    installed = source / "node_modules" / ".package-lock.json"
    lock = source / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=source, env=env, check=True)
    subprocess.run([npm, "run", "build:prod"], cwd=source, env=env, check=True)
