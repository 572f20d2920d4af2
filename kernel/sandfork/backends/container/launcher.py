"""PID 1 of a new container sandbox: make its root, lock it down, become its init.

Run as ``python -m sandfork.backends.container.launcher CONFIG_JSON`` by the shim, inside
fresh PID, mount, network, IPC and UTS namespaces. It mounts the root (an overlay: the
sandbox's writable layer over its read-only layers and the template's tree), ``/proc``, a
small ``/dev`` with the usual device nodes, ``/dev/shm`` and ``/run`` (the guest agent is
copied there, as the VM's initramfs does), brings ``lo`` up, names the host ``sandbox``,
``pivot_root``s into the new root, drops every privilege (:mod:`.lockdown`) and ``execve``s
the init command (tini with the guest agent). Everything it needs is imported before the
``pivot_root``: afterwards the host's files are gone.

``/proc``, ``/dev``, ``/dev/shm`` and ``/run`` are kernel or tmpfs mounts, which CRIU saves and
restores with the sandbox (tmpfs contents go into its image); only the root is given back by
the restorer (``criu restore --root``), because it is the overlay of the sandbox's layers.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
import socket
import struct
import sys
from dataclasses import asdict, dataclass, field

from sandfork.backends.container import lockdown

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_MNT_DETACH = 2
# The PID namespace is the shim's doing (it forks this process into one); these are ours.
_NAMESPACES = 0x00020000 | 0x40000000 | 0x08000000 | 0x04000000  # NEWNS NEWNET NEWIPC NEWUTS
_SYS_PIVOT_ROOT = 155  # x86-64
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8)}
_DEVICES |= {"urandom": (1, 9), "tty": (5, 0)}
_DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1"}
_DEV_LINKS |= {"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}
AGENT_DIR = "/run/sandfork/agent/sandfork_agent"  # what the VM's initramfs uses too

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
_libc.mount.argtypes += [ctypes.c_ulong, ctypes.c_char_p]


@dataclass(frozen=True)
class LaunchConfig:
    """What the launcher builds: the layers of the root, the agent to copy, the command."""

    root: str  # an empty directory to mount the root on
    upper: str  # the sandbox's writable layer
    work: str  # overlayfs' work directory (same file system as ``upper``)
    lower: list[str]  # read-only layers, top first, ending with the template's tree
    agent: str  # the guest agent package, copied to AGENT_DIR
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    shm_mb: int = 64
    run_mb: int = 16

    def to_json(self) -> str:
        """The config as the launcher's argument."""
        return json.dumps(asdict(self))


def overlay_options(upper: str, work: str, lower: list[str]) -> str:
    """The overlayfs mount options of a root (``lower`` top first)."""
    for path in (upper, work, *lower):
        if any(c in path for c in ",:\\\n"):
            raise ValueError(f"overlayfs cannot take a path with ',', ':' or '\\\\': {path}")
    return f"lowerdir={':'.join(lower)},upperdir={upper},workdir={work},xino=off"


def mount(
    source: str | None, target: str, fstype: str | None, flags: int = 0, data: str = ""
) -> None:
    """mount(2), raising ``OSError`` naming the target."""
    encoded = [s.encode() if s is not None else None for s in (source, target, fstype)]
    if _libc.mount(*encoded, flags, data.encode() or None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mounting {fstype or 'a bind'} on {target}: {os.strerror(code)}")


def _make_dev(root: str) -> None:
    dev = f"{root}/dev"
    mount("tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
    for name, (major, minor) in _DEVICES.items():
        os.mknod(f"{dev}/{name}", 0o666 | 0o020000, os.makedev(major, minor))
        os.chmod(f"{dev}/{name}", 0o666)
    for name, target in _DEV_LINKS.items():
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/pts")
    mount("devpts", f"{dev}/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666")
    os.mkdir(f"{dev}/shm")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _pivot(root: str) -> None:
    os.chdir(root)
    os.makedirs(".oldroot", exist_ok=True)
    if _libc.syscall(_SYS_PIVOT_ROOT, b".", b".oldroot") != 0:
        raise OSError(ctypes.get_errno(), "pivot_root failed")
    os.chdir("/")
    if _libc.umount2(b"/.oldroot", _MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "unmounting the host's root failed")
    os.rmdir("/.oldroot")


def build_root(config: LaunchConfig) -> None:
    """Mount the sandbox's file systems under ``config.root`` (in this mount namespace)."""
    root = config.root
    mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing propagates to the host
    mount("overlay", root, "overlay", 0, overlay_options(config.upper, config.work, config.lower))
    mount("proc", f"{root}/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _make_dev(root)
    shm = f"mode=1777,size={config.shm_mb}m"
    mount("shm", f"{root}/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, shm)
    os.makedirs(f"{root}/run", exist_ok=True)
    mount(
        "tmpfs", f"{root}/run", "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0755,size={config.run_mb}m"
    )
    shutil.copytree(
        config.agent, f"{root}{AGENT_DIR}", ignore=shutil.ignore_patterns("__pycache__")
    )


def launch(config: LaunchConfig) -> None:
    """Build the root, enter it, drop every privilege and exec the init command."""
    os.setsid()  # CRIU restores a session only if its leader is inside the sandbox
    if _libc.unshare(_NAMESPACES) != 0:
        raise OSError(ctypes.get_errno(), "cannot make the sandbox's namespaces")
    # While it may: the sandbox's init and agent are the last the OOM killer picks in the
    # sandbox's group (the agent gives what it starts the default back, as in a VM). Without
    # CAP_SYS_RESOURCE (some hosts drop it even for root) only down to what the engine has.
    with contextlib.suppress(PermissionError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")
    rules = lockdown.build_filter()
    build_root(config)
    _loopback_up()
    socket.sethostname("sandbox")
    _pivot(config.root)
    lockdown.drop_privileges(rules)
    os.execve(config.command[0], config.command, config.env)


def main() -> None:
    """``python -m sandfork.backends.container.launcher CONFIG_JSON``."""
    try:
        launch(LaunchConfig(**json.loads(sys.argv[1])))
    except OSError as e:
        print(f"sandfork launcher: {e}", file=sys.stderr)
        sys.exit(1 if e.errno != errno.ENOENT else 127)


if __name__ == "__main__":
    main()
