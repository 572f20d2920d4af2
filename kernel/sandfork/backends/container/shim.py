"""The keeper of one container sandbox: starts it, holds its pipes, outlives the engine.

Run as ``python -m sandfork.backends.container.shim --warm KEY`` in a session of its own,
ahead of need (:mod:`.shim_pool`): it waits, its modules imported, for one line on its stdin,
the config of the sandbox it will keep, then makes that sandbox's folder its working
directory (what the engine's sweep and the tests find it by) and its ``shim.log`` its output.
It makes the pipes that are the sandbox's stdio (the guest agent's channel on 0 and 1, its
console on 2, the egress channel on 3 and 4), then either *launches* a new sandbox (its child
becomes PID 1 of a new PID namespace and runs :mod:`.launcher`) or *restores* one from a CRIU
image (``criu restore --root`` in a throwaway mount namespace where the sandbox's overlay is
mounted, the image's pipes replaced by the new ones with ``--inherit-fd``; memory pages
served lazily by our lazy-pages server when asked). Either way the sandbox's processes join its
control group before they run, and the shim, a child subreaper, becomes their parent.

Then it serves the engine as QEMU does for a VM: each channel is a Unix socket in the engine's
RAM folder that one client at a time is relayed to; while no client is connected, what the
sandbox writes is read and dropped, so it never blocks. An engine restart reconnects; the
sandbox notices nothing. The console goes to ``console.log`` (bounded). When the sandbox's
PID 1 exits, the shim kills what is left in its group, writes ``exit.json`` and ends.

``shim.json`` in the sandbox's directory is the record a restarted engine adopts the sandbox
by (the shim's and PID 1's process ids and start times, the pipes' inode numbers, which a
snapshot needs for its restore).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import shutil
import signal
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path

from sandfork.backends.container.cgroups import Cgroup, Hierarchy
from sandfork.backends.container.launcher import LaunchConfig
from sandfork.backends.container.restoring import Lazy, restore
from sandfork.backends.container.stdio import (
    CHANNELS,
    CONSOLE_FD,
    Pipes,
    ShimConfig,
    child_setup,
    write_json,
)
from sandfork.backends.processes import start_time

RECORD = "shim.json"
EXIT = "exit.json"
CONSOLE = "console.log"
MAX_CONSOLE_BYTES = 1 << 20  # console.log is cut to its last half past this
_BUFFER = 1 << 20  # bytes held for a slow reader before the writer is paused
_CLONE_NEWPID = 0x20000000
_PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def _launch(config: ShimConfig, pipes: Pipes) -> int:
    """Fork PID 1 of a new PID namespace running the launcher; returns its pid."""
    assert config.launch is not None
    if _libc.unshare(_CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "cannot make a PID namespace")
    launch = LaunchConfig(**config.launch)
    pid = os.fork()
    if pid == 0:
        try:
            child_setup(config, pipes, pipes.sandbox)
            argv = [sys.executable, "-m", "sandfork.backends.container.launcher", launch.to_json()]
            os.execve(sys.executable, argv, {**os.environ, **config.env})
        finally:
            os._exit(127)
    return pid


class _Relay:
    """One channel: a listening socket relayed to the sandbox's pair of pipes."""

    def __init__(self, path: str, to_sandbox: int, from_sandbox: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        os.chmod(path, 0o600)
        self.server.listen(4)
        self.server.setblocking(False)
        self.to_sandbox, self.from_sandbox = to_sandbox, from_sandbox
        os.set_blocking(to_sandbox, False)
        os.set_blocking(from_sandbox, False)
        self.client: socket.socket | None = None
        self.inbound = bytearray()  # client -> sandbox, not yet written
        self.outbound = bytearray()  # sandbox -> client, not yet sent


class Shim:
    """The relay loop and the end of the sandbox."""

    def __init__(self, config: ShimConfig, pipes: Pipes, init: int, lazy: Lazy | None) -> None:
        self.config = config
        self.lazy = lazy
        self.directory = Path(config.dir)
        self.init = init
        self.selector = selectors.DefaultSelector()
        self.relays = [
            _Relay(config.sockets[name], pipes.shim[reads], pipes.shim[writes])
            for name, (reads, writes) in CHANNELS.items()
            if name in config.sockets
        ]
        self.console = pipes.shim[CONSOLE_FD]
        os.set_blocking(self.console, False)
        self.console_log = open(self.directory / CONSOLE, "ab", buffering=0)
        self.stopping = False

    def run(self) -> int:
        """Relay until PID 1 exits; returns its wait status."""
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self._arm()
        while True:
            status = self._reap()
            if status is not None:
                return status
            for key, events in self.selector.select(timeout=0.5):
                key.data(events)
            self._arm()

    def _stop(self, *_: object) -> None:
        self.stopping = True
        if self.lazy is not None:  # no page is wanted now; the kill would wait for them all
            self.lazy.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init, signal.SIGKILL)

    def _reap(self) -> int | None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 0
            if pid == 0:
                return None
            if pid == self.init:
                return status
            lazy = self.lazy
            if lazy is not None and lazy.pid == pid:
                self.lazy = None
                shutil.rmtree(lazy.images, ignore_errors=True)
                code = os.waitstatus_to_exitcode(status)
                if (
                    code != 0 and not self.stopping
                ):  # pages it had not served yet are lost: the sandbox cannot go on
                    self._note(f"the lazy-pages server failed with status {code}")
                    self._stop()

    def _note(self, text: str) -> None:
        self.console_log.write(f"sandfork shim: {text}\n".encode())

    def _arm(self) -> None:
        """(Re)register every fd with the events it waits for now."""
        self.selector.close()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.console, selectors.EVENT_READ, self._on_console)
        for relay in self.relays:
            if relay.client is None:
                self.selector.register(relay.server, selectors.EVENT_READ, self._accept(relay))
            else:
                events = selectors.EVENT_WRITE if relay.outbound else 0
                if len(relay.inbound) < _BUFFER:
                    events |= selectors.EVENT_READ
                if events:
                    self.selector.register(relay.client, events, self._on_client(relay))
            if relay.inbound:
                self.selector.register(
                    relay.to_sandbox, selectors.EVENT_WRITE, self._flush_in(relay)
                )
            if len(relay.outbound) < _BUFFER:
                self.selector.register(
                    relay.from_sandbox, selectors.EVENT_READ, self._on_sandbox(relay)
                )

    def _accept(self, relay: _Relay):  # type: ignore[no-untyped-def]
        def accept(_events: int) -> None:
            try:
                client, _ = relay.server.accept()
            except BlockingIOError:
                return
            client.setblocking(False)
            relay.client = client
            relay.outbound.clear()
            # A line cut off by the last client's end is ended here: the agent drops it.
            relay.inbound[:0] = b"\n"

        return accept

    def _on_client(self, relay: _Relay):  # type: ignore[no-untyped-def]
        def on_client(events: int) -> None:
            assert relay.client is not None
            if events & selectors.EVENT_READ:
                try:
                    data = relay.client.recv(1 << 16)
                except BlockingIOError:
                    data = None
                except OSError:
                    data = b""
                if data == b"":
                    self._drop(relay)
                    return
                if data:
                    relay.inbound += data
            if events & selectors.EVENT_WRITE and relay.outbound:
                try:
                    sent = relay.client.send(relay.outbound)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    self._drop(relay)
                    return
                del relay.outbound[:sent]

        return on_client

    def _drop(self, relay: _Relay) -> None:
        assert relay.client is not None
        relay.client.close()
        relay.client = None
        relay.outbound.clear()

    def _flush_in(self, relay: _Relay):  # type: ignore[no-untyped-def]
        def flush(_events: int) -> None:
            try:
                written = os.write(relay.to_sandbox, relay.inbound)
            except BlockingIOError:
                return
            except OSError:
                relay.inbound.clear()
                return
            del relay.inbound[:written]

        return flush

    def _on_sandbox(self, relay: _Relay):  # type: ignore[no-untyped-def]
        def on_sandbox(_events: int) -> None:
            try:
                data = os.read(relay.from_sandbox, 1 << 16)
            except BlockingIOError:
                return
            if relay.client is not None:
                relay.outbound += data

        return on_sandbox

    def _on_console(self, _events: int) -> None:
        try:
            data = os.read(self.console, 1 << 16)
        except BlockingIOError:
            return
        if self.console_log.tell() > MAX_CONSOLE_BYTES:
            self._cut_console()
        self.console_log.write(data)

    def _cut_console(self) -> None:
        path = self.directory / CONSOLE
        with contextlib.suppress(OSError):
            tail = path.read_bytes()[-MAX_CONSOLE_BYTES // 2 :]
            self.console_log.close()
            path.write_bytes(b"[sandfork: console cut]\n" + tail)
            self.console_log = open(path, "ab", buffering=0)

    def finish(self, status: int) -> None:
        """The sandbox's PID 1 is gone: end its other processes and record why."""
        with contextlib.suppress(OSError):
            Cgroup(Hierarchy.detect(), self.config.cgroup).kill()
        if self.lazy is not None:
            self.lazy.kill()
            shutil.rmtree(self.lazy.images, ignore_errors=True)
        for relay in self.relays:
            with contextlib.suppress(OSError):
                os.unlink(relay.path)
        reason = "stopped" if self.stopping else _describe(status)
        write_json(self.directory / EXIT, {"reason": reason, "at": time.time()})


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"its init was killed by signal {os.WTERMSIG(status)}"
    return f"its init exited with status {os.WEXITSTATUS(status)}"


def _take_config() -> ShimConfig | None:
    """The config the engine sends on stdin (``None``: it closed it first, nothing to keep);
    from here the sandbox's folder is the working directory and its ``shim.log`` the output."""
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return None
    config = ShimConfig(**json.loads(line))
    os.chdir(config.dir)
    log = os.open("shim.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.close(null)
    os.close(log)
    return config


def main() -> None:
    """``python -m sandfork.backends.container.shim --warm KEY``: the engine's key names its
    shims; the config comes on stdin."""
    config = _take_config()
    if config is None:
        return
    directory = Path(config.dir)
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    pipes = Pipes()
    try:
        init, lazy = (
            (_launch(config, pipes), None) if config.launch else restore(config, pipes, directory)
        )
    except Exception as e:
        write_json(
            directory / EXIT, {"reason": f"the sandbox did not start: {e}", "at": time.time()}
        )
        sys.exit(1)
    inodes = pipes.inodes()
    pipes.close_sandbox_side()
    record: dict[str, object] = {"shim": os.getpid(), "shim_start": start_time(os.getpid())}
    record |= {"init": init, "init_start": start_time(init), "pipes": inodes}
    if lazy is not None:  # a capture waits for it: see ContainerSandbox.snapshot
        record |= {"lazy": lazy.pid, "lazy_start": start_time(lazy.pid)}
    record["config"] = asdict(config)  # what it was started with
    shim = Shim(config, pipes, init, lazy)
    write_json(directory / RECORD, record)
    status = shim.run()
    shim.finish(status)


if __name__ == "__main__":
    main()
