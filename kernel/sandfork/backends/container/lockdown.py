"""What a container sandbox may not do: no capabilities, no new privileges, a seccomp filter.

The filter has the semantics of Docker's default profile for a container without added
capabilities: everything a program normally needs is allowed, and the calls that reach
beyond the container — mounting, new namespaces, kernel modules, keyrings, BPF, the clock,
swap, reboot, ``kexec``, ``perf``, ``userfaultfd``, ``io_uring``, handles to host files,
NUMA policy — fail with ``EPERM`` (``clone3`` with ``ENOSYS``, so that the C library falls
back to ``clone``, whose namespace flags are then refused). Only the x86-64 ABI is allowed:
32-bit and x32 calls kill the process, as they could dodge the rules.

With every capability dropped, most of these would fail anyway; the filter also shuts the
ones a user namespace or a kernel bug could open. CRIU saves and restores the filter with the
process, so restored copies keep it.
"""

from __future__ import annotations

import ctypes
import errno
from typing import Any

import pyseccomp as seccomp

#: System calls refused with EPERM (names unknown to this kernel are skipped).
REFUSED = (
    # mounts and the root
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "open_tree_attr",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # namespaces
    "unshare", "setns",
    # kernel modules, kexec, reboot, swap, accounting, quotas
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "acct", "quotactl", "quotactl_fd", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl",
    "syslog", "vhangup", "lookup_dcookie",
    # keyrings, BPF, tracing of the kernel, page faults in user space, io_uring
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "fanotify_init",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    # the clock is the host's
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    # raw I/O, handles to files outside the container, comparing host kernel objects
    "ioperm", "iopl", "name_to_handle_at", "open_by_handle_at", "kcmp",
    # NUMA memory policy
    "mbind", "set_mempolicy", "set_mempolicy_home_node", "move_pages", "migrate_pages",
    "get_mempolicy",
    # security attributes
    "lsm_set_self_attr",
)  # fmt: skip

#: ``clone`` flags that make namespaces: refused.
NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)

_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
# NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE set and locked, KEEP_CAPS off and locked:
# uid 0 gains no capability at execve, and none can come back.
_SECUREBITS = 0xEF
_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32)]
    _fields_ += [("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {errno.errorcode.get(code, code)}")


def build_filter() -> Any:
    """The seccomp filter, built (libseccomp resolves the names) but not loaded."""
    rules = seccomp.SyscallFilter(seccomp.ALLOW)  # other architectures: KILL (the default)
    for name in REFUSED:
        try:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError, OSError):
            continue  # not a system call of this kernel and library
    for flag in NAMESPACE_FLAGS:
        refused = seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag)
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", refused)
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    return rules


def drop_privileges(rules: Any) -> None:
    """Drop every capability for good, forbid new privileges, then load ``rules``.

    Call last before ``execve``: after it the process can do none of the setup.
    """
    cap = 0
    while _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
    _check(_libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0), "securebits")
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    rules.load()
