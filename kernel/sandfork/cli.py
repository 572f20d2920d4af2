"""The ``sandfork`` command line: serve, env, template, sandbox, doctor."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sandfork.paths import cache_dir, runtime_dir, state_dir

console = Console()


def _serve(args: argparse.Namespace) -> int:
    from sandfork.engine.app import serve
    from sandfork.engine.config import EngineConfig

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = EngineConfig(
        ip=args.ip,
        port=args.port,
        accelerator=args.accelerator,
        state_dir=args.state_dir,
        boot_snapshots=not args.no_boot_snapshots,
        allow_host_access=args.allow_host_access,
        egress_allow=args.egress_allow,
        boot_snapshot_dir=args.boot_snapshot_dir,
    )
    for setting in args.set:
        name, _, value = setting.partition("=")
        if not config.has_trait(name) or not config.trait_metadata(name, "config"):
            raise SystemExit(f"sandfork serve: --set {setting}: no engine setting {name!r}")
        config.set_trait(name, config.traits()[name].from_string(value))
    asyncio.run(serve(config))
    return 0


def _env(args: argparse.Namespace) -> int:
    from sandfork.sdk.connection import resolve

    conn = resolve(auto_start=True)
    url, key = shlex.quote(conn.url), shlex.quote(conn.api_key)
    pairs = {"SANDFORK_API": url, "SANDFORK_API_KEY": key}
    pairs |= {"PANDASTACK_API": url, "PANDASTACK_API_KEY": key}
    print("export " + " ".join(f"{k}={v}" for k, v in pairs.items()))
    return 0


def _lab(args: argparse.Namespace) -> int:
    from sandfork.sdk.connection import resolve

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

    table = Table("name", "built", "memory", "cpus", "description")
    for spec in list_specs():
        built = BuiltTemplate.find(spec)
        table.add_row(
            spec.name,
            "yes" if built else "no",
            f"{spec.memory_mb} MiB",
            str(spec.cpus),
            spec.description,
        )
    console.print(table)
    return 0


def _sandbox_ls(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    table = Table("id", "template", "status", "memory", "cpus", "created")
    for sb in Sandbox.list():
        table.add_row(
            sb.id, sb.template, sb.status, f"{sb.memory_mb} MiB", str(sb.cpu), sb.created_at
        )
    console.print(table)
    return 0


def _sandbox_create(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    with console.status(f"creating a sandbox from {args.template}…"):
        sb = Sandbox.create(args.template, memory_mb=args.memory, cpu=args.cpus, persistent=True)
    print(sb.id)
    return 0


def _sandbox_exec(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    sb = Sandbox.get(args.id)
    code = sb.exec_stream(
        " ".join(args.command),
        on_stdout=lambda s: print(s, end="", flush=True),
        on_stderr=lambda s: print(s, end="", file=sys.stderr, flush=True),
        timeout_seconds=args.timeout,
    )
    return code


def _sandbox_kill(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    targets = Sandbox.list() if args.all else [Sandbox.get(i) for i in args.ids]
    for sb in targets:
        sb.kill()
        print(f"killed {sb.id}")
    return 0


def _snapshot_ls(args: argparse.Namespace) -> int:
    from sandfork.sdk import Snapshot

    table = Table("id", "name", "sandbox", "template", "size", "created")
    for snap in Snapshot.list(sandbox_id=args.sandbox):
        size = f"{snap.size_bytes / 2**20:.0f} MiB"
        table.add_row(
            snap.id, snap.name or "", snap.sandbox_id, snap.template, size, snap.created_at
        )
    console.print(table)
    return 0


def _snapshot_create(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    print(Sandbox.get(args.sandbox).snapshot(args.name))
    return 0


def _snapshot_restore(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    print(Sandbox.create(from_snapshot=args.id, persistent=True).id)
    return 0


def _snapshot_rename(args: argparse.Namespace) -> int:
    from sandfork.sdk import Snapshot

    Snapshot.get(args.id).rename(args.name)
    return 0


def _snapshot_rm(args: argparse.Namespace) -> int:
    from sandfork.sdk import Snapshot

    for snapshot_id in args.ids:
        Snapshot.get(snapshot_id).delete()
        print(f"deleted {snapshot_id}")
    return 0


def _snapshot_export(args: argparse.Namespace) -> int:
    from sandfork.sdk import Snapshot

    with console.status(f"exporting {args.id}…"):
        Snapshot.get(args.id).export(args.file)
    console.print(f"wrote {args.file}")
    return 0


def _snapshot_import(args: argparse.Namespace) -> int:
    from sandfork.sdk import Snapshot

    with console.status(f"importing {args.file}…"):
        snap = Snapshot.import_file(args.file)
    print(snap.id)
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
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``sandfork`` command."""
    parser = argparse.ArgumentParser(prog="sandfork", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the engine (HTTP API) in the foreground")
    serve.add_argument("--ip", default="127.0.0.1", help="address to listen on (default: loopback)")
    serve.add_argument("--port", type=int, default=8765, help="port (0 picks a free one)")
    serve.add_argument("--accelerator", choices=["auto", "kvm", "tcg"], default="auto")
    serve.add_argument(
        "--state-dir", default="", help="database and sandboxes (default: SANDFORK_HOME)"
    )
    serve.add_argument(
        "--no-boot-snapshots",
        action="store_true",
        help="boot every sandbox instead of restoring its template's pre-booted snapshot",
    )
    serve.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any engine setting (see sandfork.engine.config), e.g. --set max_sandboxes=8",
    )
    serve.add_argument(
        "--boot-snapshot-dir",
        default="",
        help="directory of the pre-booted template snapshots (default: the cache's)",
    )
    serve.add_argument(
        "--allow-host-access",
        action="store_true",
        help="let sandboxes created with host_access reach the host's loopback and private "
        "networks (off: only the egress proxy, which refuses them)",
    )
    serve.add_argument(
        "--egress-allow",
        action="append",
        default=[],
        metavar="CIDR",
        help="a private network the egress proxy may reach anyway (a package mirror); repeatable",
    )
    serve.set_defaults(func=_serve)

    lab = sub.add_parser(
        "lab", help="start JupyterLab on this engine (the engine starts in the background)"
    )
    lab.add_argument("--ip", default="127.0.0.1", help="address JupyterLab listens on")
    lab.epilog = "Other options are passed to `jupyter lab` (e.g. --port=8890)."
    lab.set_defaults(func=_lab)

    env = sub.add_parser(
        "env", help="print exports pointing SDKs at the engine (starts it if needed)"
    )
    env.set_defaults(func=_env)

    template = sub.add_parser("template", help="build and list templates").add_subparsers(
        dest="template_command", required=True
    )
    build = template.add_parser("build", help="build a template image (cached by its inputs)")
    build.add_argument(
        "name", nargs="?", default="code-interpreter", help="name or path of a .toml file"
    )
    build.set_defaults(func=_template_build)
    template.add_parser("list", help="list templates").set_defaults(func=_template_list)

    sandbox = sub.add_parser("sandbox", help="manage sandboxes").add_subparsers(
        dest="sandbox_command", required=True
    )
    sandbox.add_parser("ls", help="list sandboxes").set_defaults(func=_sandbox_ls)
    create = sandbox.add_parser("create", help="create a sandbox and print its id")
    create.add_argument("--template", default="code-interpreter")
    create.add_argument("--memory", type=int, help="memory in MiB")
    create.add_argument("--cpus", type=int)
    create.set_defaults(func=_sandbox_create)
    exec_ = sandbox.add_parser("exec", help="run a command in a sandbox, streaming its output")
    exec_.add_argument("id")
    exec_.add_argument("command", nargs=argparse.REMAINDER)
    exec_.add_argument("--timeout", type=float)
    exec_.set_defaults(func=_sandbox_exec)
    kill = sandbox.add_parser("kill", help="kill sandboxes")
    kill.add_argument("ids", nargs="*")
    kill.add_argument("--all", action="store_true")
    kill.set_defaults(func=_sandbox_kill)

    snapshot = sub.add_parser("snapshot", help="manage snapshots").add_subparsers(
        dest="snapshot_command", required=True
    )
    ls = snapshot.add_parser("ls", help="list snapshots")
    ls.add_argument("--sandbox", help="only those of this sandbox")
    ls.set_defaults(func=_snapshot_ls)
    take = snapshot.add_parser("create", help="snapshot a running sandbox, print the id")
    take.add_argument("sandbox")
    take.add_argument("--name")
    take.set_defaults(func=_snapshot_create)
    restore = snapshot.add_parser("restore", help="create a sandbox from a snapshot")
    restore.add_argument("id")
    restore.set_defaults(func=_snapshot_restore)
    rename = snapshot.add_parser("rename", help="rename a snapshot")
    rename.add_argument("id")
    rename.add_argument("name")
    rename.set_defaults(func=_snapshot_rename)
    rm = snapshot.add_parser("rm", help="delete snapshots")
    rm.add_argument("ids", nargs="+")
    rm.set_defaults(func=_snapshot_rm)
    export = snapshot.add_parser("export", help="write a snapshot to one portable file")
    export.add_argument("id")
    export.add_argument("file")
    export.set_defaults(func=_snapshot_export)
    import_ = snapshot.add_parser("import", help="add a snapshot from an exported file")
    import_.add_argument("file")
    import_.set_defaults(func=_snapshot_import)

    doctor = sub.add_parser("doctor", help="check QEMU, the accelerator, images and disk space")
    doctor.add_argument("--accelerator", choices=["auto", "kvm", "tcg"], default="auto")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``sandfork`` command."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "lab":  # everything sandfork does not know goes to `jupyter lab`
        args.lab_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from sandfork.sdk.errors import SandforkError

    try:
        return int(args.func(args))
    except SandforkError as e:
        console.print(f"[red]error:[/] {e}")
        return 1
    except KeyboardInterrupt:
        return 130
