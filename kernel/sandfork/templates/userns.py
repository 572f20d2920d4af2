"""Building as an ordinary user: subordinate ids, user namespaces and the host's tools.

Root builds directly (``mmdebstrap --mode=root``, ``chroot``). Anyone else builds in a user
namespace where the kernel allows one, else (a Docker build step: its seccomp profile refuses
``unshare``) with fakechroot and fakeroot (see ``fakechroot``). In a user namespace,
``mmdebstrap --mode=unshare`` makes the tree, owned by the user's subordinate ids
(``/etc/subuid``, ``/etc/subgid``), and the later steps run as root inside
``unshare --map-users=auto --map-groups=auto --map-user=N --map-group=N --setuid 0 --setgid 0``
where they see that tree as root's own and the caller, mapped to ``N`` (just past the
subordinate block), as an ordinary owner that namespace root may write for. A tree owned by
subordinate ids is removed from inside such a namespace too.

:func:`host_problems` names what this host lacks for templates and sandboxes, each with the
command that fixes it (``sandfork doctor`` prints them, a build refuses to start without).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import TemplateError
from .proc import run, tool_path

__all__ = [
    "BUILD_TOOLS",
    "Problem",
    "build_mode",
    "build_problems",
    "host_problems",
    "in_namespace",
    "remove_tree",
    "rootless",
    "subordinate_ids",
]

SETUP = "bash scripts/setup.sh"
"""What installs every system package Sandfork needs (as root, from a checkout)."""

#: Program -> Debian package, for building templates (root and rootless alike).
BUILD_TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "apt-get": "apt",
    "dpkg-deb": "dpkg",
    "depmod": "kmod",
    "mke2fs": "e2fsprogs",
    "e2fsck": "e2fsprogs",
    "qemu-img": "qemu-utils",
}
#: Program -> Debian package, only for building as an ordinary user.
ROOTLESS_TOOLS = {"unshare": "util-linux", "newuidmap": "uidmap", "newgidmap": "uidmap"}
#: Program -> Debian package, for building as an ordinary user where the kernel refuses
#: user namespaces.
FAKECHROOT_TOOLS = {"fakechroot": "fakechroot", "fakeroot": "fakeroot"}
#: Program -> Debian package, for running sandboxes.
RUN_TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "qemu-img": "qemu-utils"}


@dataclass(frozen=True)
class Problem:
    """Something this host lacks, and exactly the command that fixes it."""

    need: str
    problem: str
    fix: str

    def line(self) -> str:
        """One line for a person: what is missing, then the fix."""
        return f"{self.need} {self.problem} — {self.fix}"


def rootless() -> bool:
    """True when templates must be built in a user namespace (not running as root)."""
    return os.geteuid() != 0


def build_mode() -> str:
    """How a root filesystem is built here: ``root`` (as root), ``unshare`` (an ordinary
    user, in a user namespace), or ``fakechroot`` (an ordinary user whose host has what a
    namespace needs but whose kernel refuses one, as in a Docker build step)."""
    if not rootless():
        return "root"
    return "unshare" if probe_namespace() is None else "fakechroot"


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def subordinate_ids(kind: str = "uid") -> tuple[int, int] | None:
    """The first block (start, count) of ``/etc/sub{kind}`` for this user, or None."""
    names = {_user(), str(os.getuid())}
    try:
        lines = Path(f"/etc/sub{kind}").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[0] in names and fields[1].isdigit() and fields[2].isdigit():
            if int(fields[2]) > 0:
                return int(fields[1]), int(fields[2])
    return None


def _missing(tools: dict[str, str]) -> list[Problem]:
    by_package: dict[str, list[str]] = {}
    for program, package in tools.items():
        if shutil.which(program, path=tool_path()) is None:
            by_package.setdefault(package, []).append(program)
    return [
        Problem(
            ", ".join(programs),
            "not installed (not on PATH)",
            f"as root: apt-get install {package} (or {SETUP})",
        )
        for package, programs in by_package.items()
    ]


def _sysctl(name: str) -> int | None:
    try:
        return int(Path("/proc/sys", *name.split(".")).read_text().strip())
    except (OSError, ValueError):
        return None


def _namespace_problems() -> list[Problem]:
    user = _user()
    found: list[Problem] = []
    for kind in ("uid", "gid"):
        if subordinate_ids(kind) is None:
            flag = "--add-subuids" if kind == "uid" else "--add-subgids"
            found.append(
                Problem(
                    f"/etc/sub{kind}",
                    f"has no subordinate {kind}s for {user}",
                    f"as root: usermod {flag} 100000-165535 {user} (a range no one else has)",
                )
            )
    if _sysctl("user.max_user_namespaces") == 0:
        found.append(
            Problem(
                "user namespaces",
                "are disabled (user.max_user_namespaces = 0)",
                "as root: sysctl -w user.max_user_namespaces=15000",
            )
        )
    if _sysctl("kernel.unprivileged_userns_clone") == 0:
        found.append(
            Problem(
                "user namespaces",
                "are disabled for ordinary users (kernel.unprivileged_userns_clone = 0)",
                "as root: sysctl -w kernel.unprivileged_userns_clone=1",
            )
        )
    if _sysctl("kernel.apparmor_restrict_unprivileged_userns") == 1:
        found.append(
            Problem(
                "user namespaces",
                "are restricted by AppArmor (kernel.apparmor_restrict_unprivileged_userns = 1)",
                "as root: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
            )
        )
    return found


def build_problems() -> list[Problem]:
    """What this host lacks to build templates as the current user (empty: nothing)."""
    found = _missing(BUILD_TOOLS)
    if rootless():
        namespace = _missing(ROOTLESS_TOOLS) + _namespace_problems()
        found += namespace
        why = None if namespace else probe_namespace()
        if why is not None:  # refused by the kernel: the build goes without a namespace
            found += [
                replace(p, problem=f"not installed, and no user namespace can be made: {why}")
                for p in _missing(FAKECHROOT_TOOLS)
            ]
    return found


def host_problems() -> list[Problem]:
    """What this host lacks to build templates and run sandboxes as the current user."""
    found = build_problems()
    named = {p.need for p in found}
    return found + [p for p in _missing(RUN_TOOLS) if p.need not in named]


def check_build_host() -> None:
    """Raise a ``TemplateError`` naming every missing need of a build and its fix."""
    problems = build_problems()
    if len(problems) == 1:
        raise TemplateError(f"cannot build templates here: {problems[0].line()}")
    if problems:
        lines = "\n".join(p.line() for p in problems)
        raise TemplateError(f"cannot build templates here:\n{lines}")


def namespace_ids() -> tuple[int, int]:
    """The (uid, gid) the caller has inside :func:`in_namespace`: just past its
    subordinate blocks, which ``--map-users=auto`` maps from 0."""
    uids, gids = subordinate_ids("uid"), subordinate_ids("gid")
    if uids is None or gids is None:
        check_build_host()
        raise TemplateError("no subordinate ids")  # not reached: check_build_host raised
    return uids[1], gids[1]


def in_namespace(args: Sequence[str]) -> list[str]:
    """``args`` run as root of a new user namespace (with its own mount and PID
    namespaces, killed with its caller) in which the caller's subordinate ids start at 0."""
    uid, gid = namespace_ids()
    return [
        "unshare",
        "--map-users=auto",
        "--map-groups=auto",
        f"--map-user={uid}",
        f"--map-group={gid}",
        "--setuid=0",
        "--setgid=0",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        "--",
        *args,
    ]


def remove_tree(path: Path) -> None:
    """Remove ``path`` from inside a user namespace (a tree owned by subordinate ids)."""
    run(in_namespace(["rm", "-rf", "--one-file-system", "--", str(path)]), what=f"removing {path}")
    if os.path.lexists(path):
        raise TemplateError(f"could not remove {path}")


@functools.cache
def probe_namespace() -> str | None:
    """None if a user namespace can be made here, else why not (one line; tried once).

    When the kernel refuses ``unshare(2)``, ``unshare``'s id-mapping helper (a child it
    forked first) waits for ever: the probe runs in a session of its own, ended after."""
    with tempfile.TemporaryFile() as err:
        try:
            probe = subprocess.Popen(
                in_namespace(["true"]),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        except (OSError, TemplateError) as e:
            return str(e).splitlines()[0]
        try:
            code = probe.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(probe.pid, signal.SIGKILL)
            probe.wait()
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    if code is None:
        return "unshare did not finish within 30 s"
    if code != 0:
        return (lines or ["unshare failed"])[-1]
    return None
