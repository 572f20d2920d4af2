"""``sandfork serve|env|lab|template|doctor``: the engine and what it needs on this host."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sandfork.cli.output import console, print_records
from sandfork.paths import cache_dir, runtime_dir, state_dir

__all__ = ["add_commands"]


def _serve(args: argparse.Namespace) -> int:
    from sandfork.engine.engine_app import run

    return run(list(args.app_args))


def _env(args: argparse.Namespace) -> int:
    from sandfork.client import resolve

    conn = resolve(auto_start=True)
    url, key = shlex.quote(conn.url), shlex.quote(conn.api_key)
    pairs = {"SANDFORK_API": url, "SANDFORK_API_KEY": key}
    pairs |= {"PANDASTACK_API": url, "PANDASTACK_API_KEY": key}
    print("export " + " ".join(f"{k}={v}" for k, v in pairs.items()))
    return 0


def _lab(args: argparse.Namespace) -> int:
    from sandfork.client import resolve

    with console.status("finding or starting the Sandfork engine…"):
        conn = resolve(auto_start=True)
    console.print(f"[green]engine[/] {conn.url} (log: {runtime_dir() / 'engine.log'})")
    env = {**os.environ, "SANDFORK_API": conn.url, "SANDFORK_API_KEY": conn.api_key}
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.ip={args.ip}", "--no-browser"]
    if os.geteuid() == 0:  # the documented setup runs as root (a VM host needs /dev/kvm)
        argv.append("--allow-root")
    from sandfork.jupyter.lab import run_lab
    from sandfork.sdk import Client

    client = Client(conn.url, conn.api_key)
    return run_lab([*argv, *args.lab_args], env, client, lambda line: console.print(line))


def _template_build(args: argparse.Namespace) -> int:
    from sandfork.templates import ensure_template

    as_file = "/" in args.name or args.name.endswith(".toml")  # the CLI may name a spec file
    built = ensure_template(Path(args.name) if as_file else args.name, progress=True)
    console.print(f"[green]template {built.name} ready[/] ({built.rootfs})")
    return 0


def _template_list(args: argparse.Namespace) -> int:
    from sandfork.templates import BuiltTemplate, list_specs

    rows = [
        {
            "name": spec.name,
            "built": BuiltTemplate.find(spec) is not None,
            "memory_mb": spec.memory_mb,
            "cpus": spec.cpus,
            "description": spec.description,
        }
        for spec in list_specs()
    ]
    columns = [("name", "name"), ("built", "built"), ("memory_mb", "memory")]
    columns += [("cpus", "cpus"), ("description", "description")]
    formats = {"built": lambda b: "yes" if b else "no", "memory_mb": lambda mb: f"{mb} MiB"}
    print_records(rows, columns, args.json, formats)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from sandfork.backends.vm.accel import detect_accelerator
    from sandfork.templates import BuiltTemplate, list_specs

    ok = True
    qemu = shutil.which("qemu-system-x86_64")
    if qemu:
        version = subprocess.run(
            [qemu, "--version"], capture_output=True, text=True
        ).stdout.splitlines()[0]
        console.print(f"[green]✓[/] QEMU: {version}")
    else:
        ok = False
        console.print("[red]✗[/] QEMU: qemu-system-x86_64 not installed (bash scripts/setup.sh)")
    for tool in ("qemu-img", "debootstrap", "mke2fs", "socat"):
        mark = "[green]✓[/]" if shutil.which(tool) else "[red]✗[/]"
        ok = ok and bool(shutil.which(tool))
        console.print(f"{mark} {tool}: {shutil.which(tool) or 'not installed'}")
    accel = detect_accelerator(args.accelerator)
    console.print(f"[green]✓[/] accelerator: {accel.name} — {accel.reason}")
    for spec in list_specs():
        built = BuiltTemplate.find(spec)
        status = f"built ({built.rootfs})" if built else "not built yet (built on first use)"
        console.print(f"  template {spec.name}: {status}")
    for label, path in (("state", state_dir()), ("cache", cache_dir())):
        path.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(path).free / 2**30
        mark = "[green]✓[/]" if free > 5 else "[yellow]![/]"
        console.print(f"{mark} {label} dir {path}: {free:.1f} GiB free")
    if not ok:
        print("hint: install the host tools with `bash scripts/setup.sh`", file=sys.stderr)
    return 0 if ok else 1


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add serve, lab, env, template and doctor to the subcommands ``sub``."""
    serve = sub.add_parser(
        "serve",
        help="run the engine (HTTP API) in the foreground; `sandfork serve --help-all` "
        "lists every setting",
        add_help=False,
        prefix_chars="\0",  # every argument goes to the engine application (traitlets)
    )
    serve.add_argument("app_args", nargs=argparse.REMAINDER)
    serve.set_defaults(func=_serve)

    lab = sub.add_parser(
        "lab",
        help="start JupyterLab on this engine (the engine starts in the background)",
        parents=[common],
    )
    lab.add_argument("--ip", default="127.0.0.1", help="address JupyterLab listens on")
    lab.epilog = "Other options are passed to `jupyter lab` (e.g. --port=8890)."
    lab.set_defaults(func=_lab)

    env = sub.add_parser(
        "env",
        help="print exports pointing SDKs at the engine (starts it if needed)",
        parents=[common],
    )
    env.set_defaults(func=_env)

    template = sub.add_parser("template", help="build and list templates").add_subparsers(
        dest="template_command", required=True
    )
    build = template.add_parser(
        "build", help="build a template image (cached by its inputs)", parents=[common]
    )
    build.add_argument(
        "name", nargs="?", default="code-interpreter", help="name or path of a .toml file"
    )
    build.set_defaults(func=_template_build)
    listing = template.add_parser("list", aliases=["ls"], help="list templates", parents=[common])
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    listing.set_defaults(func=_template_list)

    doctor = sub.add_parser(
        "doctor", help="check QEMU, the accelerator, images and disk space", parents=[common]
    )
    doctor.add_argument("--accelerator", choices=["auto", "kvm", "tcg"], default="auto")
    doctor.set_defaults(func=_doctor)
