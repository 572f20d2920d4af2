"""``sandfork sandbox ...`` and ``sandfork snapshot ...``: the engine's sandboxes and snapshots."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sandfork.cli.output import console, print_records, record

__all__ = ["add_commands"]


def _sandbox_ls(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    columns = [("id", "id"), ("template", "template"), ("status", "status")]
    columns += [("memory_mb", "memory"), ("cpu", "cpu"), ("created_at", "created")]
    rows = [record(sb) for sb in Sandbox.list()]
    print_records(rows, columns, args.json, {"memory_mb": lambda mb: f"{mb} MiB"})
    return 0


def _sandbox_create(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    with console.status(f"creating a sandbox from {args.template}…"):
        sb = Sandbox.create(args.template, memory_mb=args.memory, cpu=args.cpu, persistent=True)
    print(sb.id)
    return 0


def _sandbox_exec(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    sb = Sandbox.get(args.id)
    return sb.exec_stream(
        " ".join(args.command),
        on_stdout=lambda s: print(s, end="", flush=True),
        on_stderr=lambda s: print(s, end="", file=sys.stderr, flush=True),
        timeout_seconds=args.timeout,
    )


def _sandbox_kill(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    targets = Sandbox.list() if args.all else [Sandbox.get(i) for i in args.ids]
    for sb in targets:
        sb.kill()
        print(f"killed {sb.id}")
    return 0


def _snapshot_ls(args: argparse.Namespace) -> int:
    from sandfork.sdk import Snapshot

    columns = [("id", "id"), ("name", "name"), ("sandbox_id", "sandbox")]
    columns += [("template", "template"), ("size_bytes", "size"), ("created_at", "created")]
    rows = [record(s) for s in Snapshot.list(sandbox_id=args.sandbox)]
    print_records(rows, columns, args.json, {"size_bytes": lambda n: f"{n / 2**20:.0f} MiB"})
    return 0


def _snapshot_create(args: argparse.Namespace) -> int:
    from sandfork.sdk import Sandbox

    print(Sandbox.get(args.sandbox).snapshot(args.name).id)
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


def _command(
    group: Any, common: argparse.ArgumentParser, name: str, help: str, func: Any, *args: str
) -> argparse.ArgumentParser:
    """Add one subcommand to ``group``: positional ``args`` (``ids+``: one or more)."""
    parser: argparse.ArgumentParser = group.add_parser(name, help=help, parents=[common])
    for arg in args:
        if arg.endswith(("+", "*")):
            parser.add_argument(arg[:-1], nargs=arg[-1])
        else:
            parser.add_argument(arg)
    parser.set_defaults(func=func)
    return parser


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``sandbox`` and ``snapshot`` to the subcommands ``sub`` (``common``: shared options)."""
    json_help = "print a JSON array (every field, full ids) instead of a table"
    sandbox = sub.add_parser("sandbox", help="manage sandboxes").add_subparsers(
        dest="sandbox_command", required=True
    )
    ls = _command(sandbox, common, "ls", "list sandboxes", _sandbox_ls)
    ls.add_argument("--json", action="store_true", help=json_help)
    create = _command(sandbox, common, "create", "create a sandbox, print its id", _sandbox_create)
    create.add_argument("--template", default="code-interpreter")
    create.add_argument("--memory", type=int, help="memory in MiB")
    create.add_argument("--cpu", "--cpus", type=int, dest="cpu", help="CPUs (--cpus: older name)")
    exec_ = _command(
        sandbox, common, "exec", "run a command in a sandbox, streaming its output", _sandbox_exec
    )
    exec_.add_argument("id")
    exec_.add_argument("command", nargs=argparse.REMAINDER)
    exec_.add_argument("--timeout", type=float)
    kill = _command(sandbox, common, "kill", "kill sandboxes", _sandbox_kill, "ids*")
    kill.add_argument("--all", action="store_true")

    snapshot = sub.add_parser("snapshot", help="manage snapshots").add_subparsers(
        dest="snapshot_command", required=True
    )
    ls = _command(snapshot, common, "ls", "list snapshots", _snapshot_ls)
    ls.add_argument("--sandbox", help="only those of this sandbox")
    ls.add_argument("--json", action="store_true", help=json_help)
    take = _command(
        snapshot, common, "create", "snapshot a running sandbox, print the id", _snapshot_create
    )
    take.add_argument("sandbox")
    take.add_argument("--name")
    _command(
        snapshot, common, "restore", "create a sandbox from a snapshot", _snapshot_restore, "id"
    )
    _command(snapshot, common, "rename", "rename a snapshot", _snapshot_rename, "id", "name")
    _command(snapshot, common, "rm", "delete snapshots", _snapshot_rm, "ids+")
    _command(
        snapshot, common, "export", "write a snapshot to one file", _snapshot_export, "id", "file"
    )
    _command(
        snapshot, common, "import", "add a snapshot from an exported file", _snapshot_import, "file"
    )
