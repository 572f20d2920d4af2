"""A template built cold: as root (``mmdebstrap --mode=root``) and as an ordinary user
(``mmdebstrap --mode=unshare`` and a user namespace), medians of ``--runs`` each.

Each build starts from an empty Sandfork cache and an empty pip cache (packages come through
the machine's proxy every time). The user is made for the run (``tests/unprivileged.py``),
gets the wheel of this checkout in a virtualenv of its own (not timed), and is removed after.
Run as root; writes ``docs/benchmarks/template_build.json``.

    .venv/bin/python benchmarks/bench_template_build.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from unprivileged import UnprivilegedUser, install_wheel, new_user

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = "code-interpreter"
OUT = REPO / "docs" / "benchmarks" / "template_build.json"


def as_root(runs: int) -> list[float]:
    """Cold builds by root, each in an empty cache of its own."""
    times = []
    for _ in range(runs):
        cache = Path(tempfile.mkdtemp(prefix="bench-template-"))
        env = {**os.environ, "SANDFORK_CACHE_DIR": str(cache), "PIP_CACHE_DIR": str(cache / "pip")}
        started = time.monotonic()
        subprocess.run(
            [str(REPO / ".venv" / "bin" / "sandfork"), "template", "build", TEMPLATE],
            check=True,
            env=env,
            capture_output=True,
        )
        times.append(time.monotonic() - started)
        shutil.rmtree(cache, ignore_errors=True)
        print(f"root: {times[-1]:.1f} s", flush=True)
    return times


def as_user(user: UnprivilegedUser, runs: int) -> list[float]:
    """Cold builds by an ordinary user, its ``~/.cache`` emptied before each."""
    env = user.login_env(PATH="/usr/local/bin:/usr/bin:/bin", LANG="C.UTF-8")
    venv = user.home / "venv"
    install_wheel(user, REPO, venv, env)
    times = []
    for _ in range(runs):
        shutil.rmtree(user.home / ".cache", ignore_errors=True)
        started = time.monotonic()
        argv = [str(venv / "bin" / "sandfork"), "template", "build", TEMPLATE]
        user.output(argv, env, cwd=user.home, timeout=1800)
        times.append(time.monotonic() - started)
        print(f"user: {times[-1]:.1f} s", flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark makes (and removes) an ordinary user")
    root = as_root(args.runs)
    with new_user("sandfork-bench") as user:
        rootless = as_user(user, args.runs)
    result = {
        "runs": args.runs,
        "root (s)": root,
        "rootless (s)": rootless,
        "root median (s)": statistics.median(root),
        "rootless median (s)": statistics.median(rootless),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    ratio = result["rootless median (s)"] / result["root median (s)"]
    print(
        f"cold template build, median of {args.runs}: root {result['root median (s)']:.1f} s, "
        f"rootless {result['rootless median (s)']:.1f} s (rootless/root {ratio:.2f}x)"
    )


if __name__ == "__main__":
    main()
