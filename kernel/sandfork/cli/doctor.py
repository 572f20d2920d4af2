"""``sandfork doctor``: what this host has and lacks, one line each, with the fix."""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

from rich.markup import escape

from sandfork.cli.output import console
from sandfork.paths import cache_dir, state_dir

__all__ = ["doctor"]

_OK, _BAD, _WARN = "[green]✓[/]", "[red]✗[/]", "[yellow]![/]"


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _kvm_line(preference: str) -> str:
    """The accelerator line: KVM, or why not (with the fix when it is a permission)."""
    from sandfork.backends.vm.accel import detect_accelerator

    accel = detect_accelerator(preference)
    kvm = Path("/dev/kvm")
    if accel.name == "tcg" and Path("/sys/module/kvm_pvm").exists():  # no use, even if allowed
        return f"{_OK} accelerator: tcg — /dev/kvm is PVM (module kvm_pvm): TCG"
    if accel.name == "tcg" and kvm.exists() and not os.access(kvm, os.R_OK | os.W_OK):
        return (
            f"{_WARN} accelerator: TCG (slower): /dev/kvm is not accessible to {_user()} — "
            f"as root: usermod -aG kvm {_user()} (then log in again)"
        )
    return f"{_OK} accelerator: {accel.name} — {accel.reason}"


def _backend_lines(accelerator: str) -> list[str]:
    """Which backend sandboxes run on by default and why; whether containers can run here."""
    from sandfork.backends.container.backend import unavailable
    from sandfork.backends.vm.accel import detect_accelerator
    from sandfork.engine.backends import pick

    container = unavailable()
    vm = None if shutil.which("qemu-system-x86_64") else "QEMU is not installed"
    kvm = detect_accelerator(accelerator).name == "kvm"
    lines = []
    if container is None:
        lines.append(f"{_OK} containers: CRIU works, cgroups, namespaces (native speed)")
    else:
        lines.append(f"{_WARN} containers: unavailable — {escape(container)}")
    try:
        name, why = pick("auto", kvm, {"vm": vm, "container": container})
        lines.append(f"{_OK} backend: {name} by default (auto) — {escape(why)}")
    except ValueError as e:
        lines.append(f"{_BAD} backend: {escape(str(e))}")
    return lines


def doctor(args: argparse.Namespace) -> int:
    """Print a line per need of this host (✓ met, ✗ missing with its fix); exit 1 if any
    is missing."""
    from sandfork.templates import BuiltTemplate, list_specs
    from sandfork.templates.cache import template_roots
    from sandfork.templates.userns import (
        build_problems,
        host_problems,
        probe_namespace,
        rootless,
    )

    problems = host_problems()
    ok = not problems
    for problem in problems:
        console.print(f"{_BAD} {escape(problem.line())}", highlight=False, soft_wrap=True)
    qemu = shutil.which("qemu-system-x86_64")
    if qemu:
        run = subprocess.run([qemu, "--version"], capture_output=True, text=True, check=False)
        console.print(f"{_OK} QEMU: {(run.stdout.splitlines() or ['?'])[0]}", highlight=False)
    if not rootless() and not build_problems():
        console.print(f"{_OK} template builds: as root (mmdebstrap --mode=root, chroot)")
    elif rootless() and not build_problems():
        why = probe_namespace()
        if why is None:
            console.print(f"{_OK} template builds: as {_user()} in a user namespace (rootless)")
        else:
            console.print(
                f"{_OK} template builds: as {_user()} with fakechroot and fakeroot (no user"
                f" namespace: {escape(why)})",
                highlight=False,
                soft_wrap=True,
            )
    console.print(_kvm_line(args.accelerator), highlight=False, soft_wrap=True)
    for line in _backend_lines(args.accelerator):
        console.print(line, highlight=False, soft_wrap=True)
        ok = ok and not line.startswith(_BAD)
    for spec in list_specs():
        built = BuiltTemplate.find(spec)
        status = f"built ({built.rootfs})" if built else "not built yet (built on first use)"
        console.print(f"  template {spec.name}: {status}", highlight=False, soft_wrap=True)
    shared = template_roots()[1:]
    if shared:
        console.print(f"  shared templates: {', '.join(map(str, shared))}", highlight=False)
    for label, path in (("state", state_dir()), ("cache", cache_dir())):
        path.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(path).free / 2**30
        mark = _OK if free > 5 else _WARN
        console.print(f"{mark} {label} dir {path}: {free:.1f} GiB free", highlight=False)
    if not ok:
        print(
            "hint: install the host tools with `bash scripts/setup.sh` (as root)", file=sys.stderr
        )
        return 1
    return 0
