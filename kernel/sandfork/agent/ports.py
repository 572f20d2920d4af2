"""The TCP ports servers listen on in the guest (the ``ports`` op), from ``/proc/net/tcp``.

The agent's own listeners (the proxy address) and each kernel's own (ipykernel's IOPub pipe
listens on a loopback port) are not servers of the sandbox's: a kernel's are the ports it
listened on once it was ready, before any code of the user's ran in it. A server the user
starts in a kernel (a Dash app in a cell) is listed.
"""

from __future__ import annotations

import os

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"  # the state of a listening socket
MAX_LISTED = 1000


def listening() -> dict[int, int]:
    """Each listening socket's inode and port."""
    found: dict[int, int] = {}
    for table in _TABLES:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            try:
                found[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
            except (ValueError, IndexError):
                continue
    return found


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes: set[int] = set()
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"{folder}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def listened_by(pid: int) -> frozenset[int]:
    """The ports process ``pid`` listens on."""
    held = socket_inodes(pid)
    return frozenset(port for inode, port in listening().items() if inode in held)


def servers(not_these: frozenset[int]) -> list[int]:
    """The ports a server listens on, ascending: not the agent's, nor those in ``not_these``."""
    own = socket_inodes(os.getpid())
    found = {p for inode, p in listening().items() if inode not in own and p not in not_these}
    return sorted(found)[:MAX_LISTED]
