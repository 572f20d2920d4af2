"""What a launched QEMU process leaves for a later engine to find it by: a record in its
VM's folder, and its command line."""

from __future__ import annotations

import json
from pathlib import Path

from sandfork.backends.processes import sandbox_processes, start_time

RECORD = "machine.json"  # written at launch: what adoption and health checks go by


class VmError(Exception):
    """The VM could not be started or has failed."""


def write_record(directory: Path, pid: int, image: Path) -> None:
    """Record a launched QEMU process: its pid, start time and the memory image it maps."""
    data = {"pid": pid, "start": start_time(pid), "image": str(image)}
    tmp = directory / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(data))
    tmp.rename(directory / RECORD)


def read_record(directory: Path) -> dict[str, object]:
    """What :func:`write_record` wrote for the VM of ``directory``."""
    try:
        data = json.loads((directory / RECORD).read_text())
    except (OSError, ValueError) as e:
        raise VmError(f"its launch record is unreadable ({e})") from e
    if not isinstance(data, dict):
        raise VmError("its launch record is not an object")
    return data


def qemu_processes(root: Path) -> dict[str, int]:
    """The QEMU processes running a VM whose directory is in ``root``: {directory name: pid}."""
    return sandbox_processes(root, _vm_folder)


def _vm_folder(args: list[bytes]) -> bytes | None:
    if not args[0].endswith(b"qemu-system-x86_64") or b"-serial" not in args:
        return None
    console = args[args.index(b"-serial") + 1].removeprefix(b"file:")  # <dir>/console.log
    return console.rsplit(b"/", 1)[0]
