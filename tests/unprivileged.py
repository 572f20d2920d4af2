"""An ordinary user made by a test (run as root): created with ``/etc/subuid`` and
``/etc/subgid`` entries, commands run as it with an environment of the test's choosing, its
processes found by their ids, and the user removed afterwards with its home and processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypedDict


class _AsUser(TypedDict):
    """The arguments of ``subprocess`` that make a process the user's."""

    cwd: Path
    env: dict[str, str]
    user: int
    group: int
    extra_groups: list[int]


# Runs a command the way a Docker build step runs it as far as namespaces go: unshare(2)
# refused (EPERM), clone3(2) absent (ENOSYS), as Docker's default seccomp profile has it
# without CAP_SYS_ADMIN. libseccomp through ctypes; no_new_privs comes with the filter.
NO_USER_NAMESPACES = """\
import ctypes, errno, os, sys

lib = ctypes.CDLL("libseccomp.so.2")
lib.seccomp_init.restype = ctypes.c_void_p
lib.seccomp_init.argtypes = [ctypes.c_uint32]
lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
lib.seccomp_load.argtypes = [ctypes.c_void_p]
context = lib.seccomp_init(0x7FFF0000)  # allow the rest
for name, error in ((b"unshare", errno.EPERM), (b"clone3", errno.ENOSYS)):
    number = lib.seccomp_syscall_resolve_name(name)
    assert lib.seccomp_rule_add(context, 0x00050000 | error, number, 0) == 0
assert lib.seccomp_load(context) == 0
os.execvp(sys.argv[1], sys.argv[1:])
"""


@dataclass
class UnprivilegedUser:
    """A user of this machine without privileges, and commands run as it (not as root)."""

    name: str
    uid: int
    gid: int
    home: Path

    def _as_user(self, cwd: Path, env: Mapping[str, str]) -> _AsUser:
        """What a new process runs with: the user's ids (no supplementary groups), ``cwd``,
        and ``env`` as its whole environment."""
        return {
            "cwd": cwd,
            "env": dict(env),
            "user": self.uid,
            "group": self.gid,
            "extra_groups": [],
        }

    def login_env(self, **settings: str) -> dict[str, str]:
        """The user's ``HOME`` and ``USER``, and ``settings``: no variable of the test."""
        return {"HOME": str(self.home), "USER": self.name, **settings}

    def call(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        cwd: Path,
        timeout: float,
        log: IO[bytes] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as the user with just ``env``; the finished process, its stdout and
        stderr captured as text, or both written to ``log``."""
        return subprocess.run(
            list(argv),
            **self._as_user(cwd, env),
            stdout=subprocess.PIPE if log is None else log,
            stderr=subprocess.PIPE if log is None else subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )

    def output(
        self, argv: Sequence[str], env: Mapping[str, str], *, cwd: Path, timeout: float
    ) -> str:
        """Run ``argv`` as the user; its stdout (the test fails if it fails)."""
        done = self.call(argv, env, cwd=cwd, timeout=timeout)
        assert done.returncode == 0, f"{list(argv)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], *, cwd: Path, output: Path
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` as the user in a session of its own, its output appended to
        ``output``; not waited for."""
        with output.open("ab") as out:
            return subprocess.Popen(
                list(argv),
                **self._as_user(cwd, env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def processes(self, command: bytes = b"") -> list[int]:
        """The ids of the user's processes whose command line holds ``command``."""
        return processes_of(self.uid, command)


@contextlib.contextmanager
def new_user(name: str) -> Iterator[UnprivilegedUser]:
    """A new user ``name`` with an empty home and subordinate ids (one of that name an
    interrupted run left is removed first); removed afterwards with everything it left."""
    remove_user(name)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
    give_subordinate_ids(name)
    entry = pwd.getpwnam(name)
    try:
        yield UnprivilegedUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    finally:
        remove_user(name)


def give_subordinate_ids(name: str) -> None:
    """Subordinate uids and gids for the user's namespaces, past every range in use (where
    ``useradd`` did not add them already, as it does where ``SUB_UID_COUNT`` is set); under
    a lock, since the suite's workers may add two users at once."""
    with open("/run/sandfork-test-subids.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        _give_subordinate_ids(name)


def _give_subordinate_ids(name: str) -> None:
    for kind, flag in (("subuid", "--add-subuids"), ("subgid", "--add-subgids")):
        table = Path(f"/etc/{kind}")
        lines = table.read_text().splitlines() if table.exists() else []
        if any(line.split(":")[0] == name for line in lines):
            continue
        ends = [int(f[1]) + int(f[2]) for f in (line.split(":") for line in lines) if len(f) == 3]
        start = max([100000, *ends])
        subprocess.run(["usermod", flag, f"{start}-{start + 65535}", name], check=True)


def remove_user(name: str) -> None:
    """End the user's processes (TERM, then KILL), then delete it and its home; nothing if
    there is no such user."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes_of(uid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 60  # a hang, not a speed
        while processes_of(uid) and time.monotonic() < deadline:
            time.sleep(0.2)
    subprocess.run(["userdel", "--remove", name], check=True, capture_output=True)


def processes_of(uid: int, command: bytes = b"") -> list[int]:
    """The ids of the processes ``uid`` runs whose command line holds ``command``."""
    pids = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                if not command or command in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


def install_wheel(user: UnprivilegedUser, repo: Path, venv: Path, env: Mapping[str, str]) -> None:
    """Build the wheel of the checkout ``repo`` (its lab extension included) and install it
    into a new virtualenv ``venv`` of the user's, with the system's Python 3."""
    out = Path(tempfile.mkdtemp(prefix="wheel-"))
    try:
        build_env = {**os.environ, "PATH": f"{repo / '.venv' / 'bin'}:{os.environ['PATH']}"}
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(repo)],
            check=True,
            env=build_env,
            cwd=repo,
        )
        (wheel,) = out.glob("sandfork-*.whl")
        given = user.home / wheel.name
        shutil.copyfile(wheel, given)
        os.chown(given, user.uid, user.gid)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    user.output(["/usr/bin/python3", "-m", "venv", str(venv)], env, cwd=user.home, timeout=300)
    pip = [str(venv / "bin" / "pip"), "install", "-q", str(given)]
    user.output(pip, env, cwd=user.home, timeout=600)


def without_user_namespaces(user: UnprivilegedUser, argv: Sequence[str]) -> list[str]:
    """``argv`` behind ``NO_USER_NAMESPACES`` (written into the user's home), to run as the
    user: what a Docker build step allows it."""
    wrapper = user.home / "no_user_namespaces.py"
    wrapper.write_text(NO_USER_NAMESPACES)
    return ["python3", str(wrapper), *argv]
