"""Guest-wide operations and environment: clock, entropy, OOM protection, child env."""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import time

from .protocol import AgentError

log = logging.getLogger(__name__)

VENV_BIN = "/opt/venv/bin"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# From <linux/random.h>: _IOW('R', 0x03, int[2]) and _IO('R', 0x07).
_RNDADDENTROPY = 0x40085203
_RNDRESEEDCRNG = 0x5207


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for commands and kernels: the agent's, a fixed PATH, then ``extra``."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{SYSTEM_PATH}" if os.path.isdir(VENV_BIN) else SYSTEM_PATH
    if extra:
        env.update(extra)
    return env


def work_dir() -> str:
    """Default working directory: /root when usable, else the home directory, else the cwd."""
    for candidate in ("/root", os.path.expanduser("~")):
        if os.path.isdir(candidate) and os.access(candidate, os.R_OK | os.X_OK):
            return candidate
    return os.getcwd()


def protect_from_oom() -> None:
    """Make the OOM killer never pick the agent (needs CAP_SYS_RESOURCE; else ignored)."""
    _write_oom_score_adj("self", -1000)


#: The OOM score adjustment of user work (commands, kernels): above the agent's, so that a
#: sandbox out of memory loses the user's process even where the agent could not protect
#: itself with -1000 (a container on a host that gives root no CAP_SYS_RESOURCE; raising a
#: score needs no privilege).
USER_OOM_SCORE_ADJ = 300


def reset_oom_score(pid: int) -> None:
    """Give a freshly spawned child the OOM score of user work, not the agent's."""
    _write_oom_score_adj(str(pid), USER_OOM_SCORE_ADJ)


def _write_oom_score_adj(pid: str, value: int) -> None:
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write(str(value))
    except OSError as exc:
        log.debug("cannot set oom_score_adj of %s to %d: %s", pid, value, exc)


def set_time(epoch_ns: int) -> None:
    """Set the guest's realtime clock (after a restore the guest clock is stale)."""
    try:
        time.clock_settime_ns(time.CLOCK_REALTIME, epoch_ns)
    except PermissionError as exc:
        raise AgentError("PermissionDenied", f"cannot set the clock: {exc.strerror}") from None
    except OSError as exc:
        raise AgentError("BadRequest", f"cannot set the clock: {exc.strerror}") from None


def reseed(entropy: bytes) -> None:
    """Mix host-provided entropy into the guest's pool so that forked VMs diverge.

    Writing /dev/urandom mixes the bytes in; when privileged, the bytes are also credited
    and the CRNG is reseeded at once rather than at its next periodic reseed.
    """
    with open("/dev/urandom", "wb") as f:
        f.write(entropy)
        try:
            info = struct.pack("ii", len(entropy) * 8, len(entropy)) + entropy
            fcntl.ioctl(f.fileno(), _RNDADDENTROPY, info)
            fcntl.ioctl(f.fileno(), _RNDRESEEDCRNG)
        except OSError as exc:
            log.debug("entropy ioctls unavailable: %s", exc)


def boot_id() -> str:
    """The kernel's boot id (changes on every boot, not on snapshot restore)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def uptime_s() -> float:
    """Seconds since the guest booted."""
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.monotonic()
