"""A userfaultfd handler's side of ``linux/userfaultfd.h``: the messages it reads and the
ioctls that answer them, made through ctypes so the interpreter's lock is let go while the
kernel copies."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass

EVENT_PAGEFAULT, EVENT_FORK, EVENT_REMAP, EVENT_REMOVE, EVENT_UNMAP = 0x12, 0x13, 0x14, 0x15, 0x16
MESSAGE = 32  # sizeof(struct uffd_msg)
_HEAD = struct.Struct("<B7x")
_ARGS = struct.Struct("<QQQ")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


def _iowr(number: int, size: int, read_only: bool = False) -> int:
    direction = 2 if read_only else 3  # _IOR, _IOWR
    return direction << 30 | size << 16 | 0xAA << 8 | number


class _Range(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Copy(ctypes.Structure):
    _fields_ = [
        ("dst", ctypes.c_uint64),
        ("src", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("copy", ctypes.c_int64),
    ]


class _Zero(ctypes.Structure):
    _fields_ = [("range", _Range), ("mode", ctypes.c_uint64), ("zeropage", ctypes.c_int64)]


_UNREGISTER = _iowr(0x01, ctypes.sizeof(_Range), read_only=True)
_WAKE = _iowr(0x02, ctypes.sizeof(_Range), read_only=True)
_COPY = _iowr(0x03, ctypes.sizeof(_Copy))
_ZEROPAGE = _iowr(0x04, ctypes.sizeof(_Zero))


@dataclass(frozen=True)
class Message:
    """One ``uffd_msg``: a page fault (``a`` its address), a fork (``a`` the child's new
    userfaultfd), a remap (``a`` from, ``b`` to, ``c`` length), a remove or an unmap
    (``a`` start, ``b`` end)."""

    event: int
    a: int
    b: int
    c: int


def read_messages(fd: int) -> list[Message]:
    """The messages waiting on a non-blocking userfaultfd (none if it has none)."""
    try:
        data = os.read(fd, MESSAGE * 64)
    except BlockingIOError:
        return []
    out = []
    for position in range(0, len(data) - MESSAGE + 1, MESSAGE):
        (event,) = _HEAD.unpack_from(data, position)
        a, b, c = _ARGS.unpack_from(data, position + 8)
        if event == EVENT_PAGEFAULT:
            a = b  # struct uffd_pagefault: flags, then the address
        elif event == EVENT_FORK:
            a &= 0xFFFFFFFF  # a u32 fd
        out.append(Message(event, a, b, c))
    return out


def copy(fd: int, dst: int, src: int, length: int) -> tuple[int, int]:
    """``UFFDIO_COPY`` of ``length`` bytes at address ``src`` here to ``dst`` there: the bytes
    copied and 0, or those copied before it stopped and the errno that stopped it."""
    args = _Copy(dst, src, length, 0, 0)
    if _libc.ioctl(fd, _COPY, ctypes.byref(args)) == 0:
        return length, 0
    error = ctypes.get_errno()
    return max(args.copy, 0), error


def zero(fd: int, start: int, length: int) -> int:
    """``UFFDIO_ZEROPAGE``: 0 or the errno."""
    args = _Zero(_Range(start, length), 0, 0)
    return 0 if _libc.ioctl(fd, _ZEROPAGE, ctypes.byref(args)) == 0 else ctypes.get_errno()


def wake(fd: int, start: int, length: int) -> int:
    """``UFFDIO_WAKE``: wake what waits on pages another copy put in place; 0 or the errno."""
    args = _Range(start, length)
    return 0 if _libc.ioctl(fd, _WAKE, ctypes.byref(args)) == 0 else ctypes.get_errno()


def unregister(fd: int, start: int, length: int) -> int:
    """``UFFDIO_UNREGISTER``: faults there are no longer this handler's; 0 or the errno."""
    args = _Range(start, length)
    return 0 if _libc.ioctl(fd, _UNREGISTER, ctypes.byref(args)) == 0 else ctypes.get_errno()


GONE = (errno.ESRCH, errno.ENOSPC)  # the process (its memory) is no more
