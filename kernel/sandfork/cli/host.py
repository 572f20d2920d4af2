"""``sandfork serve|env|lab|template|doctor``: the engine and what it needs on this host."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from sandfork.cli.doctor import doctor as _doctor
from sandfork.cli.output import console, print_records
from sandfork.paths import runtime_dir

__all__ = ["add_commands"]


def _serve(args: argparse.Namespace) -> int:
    from sandfork.engine.cli import run

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
            "cpu": spec.cpu,
            "description": spec.description,
        }
        for spec in list_specs()
    ]
    columns = [("name", "name"), ("built", "built"), ("memory_mb", "memory")]
    columns += [("cpu", "cpu"), ("description", "description")]
    formats = {"built": lambda b: "yes" if b else "no", "memory_mb": lambda mb: f"{mb} MiB"}
    print_records(rows, columns, args.json, formats)
    return 0


def _template_export(args: argparse.Namespace) -> int:
    from sandfork.templates.exchange import export_template

    with console.status(f"exporting template {args.name}…"):
        export_template(args.name, Path(args.file))
    console.print(f"wrote {args.file}")
    return 0


def _template_import(args: argparse.Namespace) -> int:
    from sandfork.templates.exchange import import_template

    with console.status(f"importing {args.file}…"):
        name, where = import_template(Path(args.file), Path(args.into) if args.into else None)
    console.print(f"[green]template {name} ready[/] ({where})")
    return 0


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

    template = sub.add_parser(
        "template", help="build, list, export, import templates"
    ).add_subparsers(dest="template_command", required=True)
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
        "doctor",
        help="check what this host lacks (one line each, with the fix), KVM, templates, disk",
        parents=[common],
    )
    doctor.add_argument("--accelerator", choices=["auto", "kvm", "tcg"], default="auto")
    doctor.set_defaults(func=_doctor)

    export = template.add_parser(
        "export", help="write a built template to one file", parents=[common]
    )
    export.add_argument("name", help="template name")
    export.add_argument("file", help="the new file (a zstd-compressed tar)")
    export.set_defaults(func=_template_export)
    imp = template.add_parser(
        "import", help="add a template from an exported file (verified)", parents=[common]
    )
    imp.add_argument("file")
    imp.add_argument(
        "--into",
        metavar="DIR",
        help="a folder of templates for every user (e.g. /usr/share/sandfork/templates, "
        "read-only to them; $SANDFORK_TEMPLATE_PATH lists others) instead of your cache",
    )
    imp.set_defaults(func=_template_import)
