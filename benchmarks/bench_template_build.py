"""A template built cold: as root (``mmdebstrap --mode=root``), as an ordinary user
(``mmdebstrap --mode=unshare`` and a user namespace), and as that user with user namespaces
refused, as in a Docker build step (``mmdebstrap --mode=fakechroot``, fakechroot and
fakeroot), medians of ``--runs`` each, the three interleaved so that they share the load.

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
from unprivileged import UnprivilegedUser, install_wheel, new_user, without_user_namespaces

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = "code-interpreter"
OUT = REPO / "docs" / "benchmarks" / "template_build.json"


def as_root() -> float:
    """A cold build by root, in an empty cache of its own."""
    cache = Path(tempfile.mkdtemp(prefix="bench-template-"))
    env = {**os.environ, "SANDFORK_CACHE_DIR": str(cache), "PIP_CACHE_DIR": str(cache / "pip")}
    started = time.monotonic()
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "sandfork"), "template", "build", TEMPLATE],
        check=True,
        env=env,
        capture_output=True,
    )
    shutil.rmtree(cache, ignore_errors=True)
    return time.monotonic() - started


def as_user(user: UnprivilegedUser, namespaces: bool) -> float:
    """A cold build by an ordinary user, its ``~/.cache`` emptied first; without
    ``namespaces``, user namespaces are refused to it."""
    env = user.login_env(PATH="/usr/local/bin:/usr/bin:/bin", LANG="C.UTF-8")
    shutil.rmtree(user.home / ".cache", ignore_errors=True)
    argv = [str(user.home / "venv" / "bin" / "sandfork"), "template", "build", TEMPLATE]
    if not namespaces:
        argv = without_user_namespaces(user, argv)
    started = time.monotonic()
    user.output(argv, env, cwd=user.home, timeout=1800)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark makes (and removes) an ordinary user")
    times: dict[str, list[float]] = {"root": [], "rootless": [], "fakechroot": []}
    with new_user("sandfork-bench") as user:
        env = user.login_env(PATH="/usr/local/bin:/usr/bin:/bin", LANG="C.UTF-8")
        install_wheel(user, REPO, user.home / "venv", env)
        for _ in range(args.runs):
            for name, build in (
                ("root", as_root),
                ("rootless", lambda: as_user(user, namespaces=True)),
                ("fakechroot", lambda: as_user(user, namespaces=False)),
            ):
                times[name].append(build())
                print(f"{name}: {times[name][-1]:.1f} s", flush=True)
    result: dict[str, object] = {"runs": args.runs}
    for name, runs in times.items():
        result[f"{name} (s)"] = runs
        result[f"{name} median (s)"] = statistics.median(runs)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    medians = {name: statistics.median(runs) for name, runs in times.items()}
    print(
        f"cold template build, median of {args.runs}: root {medians['root']:.1f} s, "
        f"rootless {medians['rootless']:.1f} s, fakechroot {medians['fakechroot']:.1f} s"
    )


if __name__ == "__main__":
    main()
