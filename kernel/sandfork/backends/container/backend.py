"""The container backend: each sandbox a process tree in its own namespaces, captured by CRIU.

It runs the template's own root filesystem (as a tree, :mod:`.tree`) under an overlay of the
sandbox's layers (:mod:`.layers`), the same guest agent and ipykernels as a VM, at native
speed; the boundary is the kernel's: namespaces (PID, mount, network with only ``lo``, IPC,
UTS), a control group with memory, process and CPU limits (:mod:`.cgroups`), no
capabilities, no new privileges and a seccomp filter (:mod:`.lockdown`). Each sandbox has a
shim (:mod:`.shim`) that outlives the engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from sandfork.backends.agent_link import ADOPT_WAIT_S
from sandfork.backends.base import CaptureRequest, MachineSpec, StartPoint
from sandfork.backends.container import criu as criu_tools
from sandfork.backends.container import layers
from sandfork.backends.container.cgroups import Cgroup, Hierarchy, Limits
from sandfork.backends.container.launcher import AGENT_DIR, LaunchConfig
from sandfork.backends.container.sandbox import IMAGES, PIPES, ContainerError, ContainerSandbox
from sandfork.backends.container.shim import RECORD
from sandfork.backends.container.shim_pool import ShimPool, shims
from sandfork.backends.container.stdio import RestoreConfig, ShimConfig
from sandfork.backends.container.tree import tree_of
from sandfork.backends.processes import kill_process, start_time
from sandfork.templates import BuiltTemplate
from sandfork.templates.initramfs import agent_dir, agent_files, files_hash

#: Bump when what a sandbox's capture depends on changes (the launcher's mounts, the fds).
CONTAINER_REVISION = 1
DISK = "disk" + layers.SUFFIX  # a boot capture's disk layer
SOCKET_SUFFIXES = (".agent", ".egress")
IMAGE_LINKS = ".images"  # beside its sockets: a restored sandbox's links to its image files
_HOOK = """#!/bin/sh
# CRIU's action script: at post-dump (all dumped, nothing resumed) let the engine copy the
# sandbox's files; if the engine is gone the connection fails and the dump goes on.
[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] || exit 0
exec {python} -I -S -c '
import os, socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(os.environ["SANDFORK_DUMP_HOOK"])
    s.sendall(b"frozen\\n")
    s.recv(16)
except OSError:
    pass
'
"""
_GUEST_PATH = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PROXY = "http://127.0.0.1:3128"
#: A container sandbox's PID 1: tini, reaping, with the guest agent on the shim's pipes.
INIT_COMMAND = (
    "/usr/bin/tini",
    "-s",
    "--",
    "/opt/venv/bin/python",
    "-m",
    "sandfork_agent",
    "--stdio",
)  # the agent's egress relay, as in a VM


def guest_env() -> dict[str, str]:
    """The agent's environment, as the VM's guest init gives it."""
    proxies = {name: _PROXY for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    # as in a VM (where 10.0.2.2 is the host for host_access sandboxes): one environment
    local = {name: "localhost,127.0.0.1,10.0.2.2" for name in ("NO_PROXY", "no_proxy")}
    return {
        **proxies,
        **local,
        "PATH": _GUEST_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(Path(AGENT_DIR).parent),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def engine_groups(state_dir: Path) -> str:
    """The control group (relative to each hierarchy) under which an engine with its state in
    ``state_dir`` makes its sandboxes' groups."""
    return "sandfork/" + hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


def unavailable() -> str | None:
    """Why container sandboxes cannot run on this host, in one line (``None``: they can)."""
    if os.geteuid() != 0:
        return (
            "container sandboxes need root: CRIU must checkpoint processes in namespaces of "
            "their own, which an ordinary user's CRIU cannot restore"
        )
    if shutil.which("debugfs", path=criu_tools.tool_path()) is None:
        return "debugfs is missing (Debian package e2fsprogs)"
    reason = Hierarchy.detect().usable()
    if reason is not None:
        return reason
    try:
        criu_tools.require()
    except criu_tools.CriuError as e:
        return str(e)
    return None


class ContainerBackend:
    """Runs sandboxes as CRIU-captured process trees over overlays of a template's tree."""

    name = "container"
    isolation = "container"
    accelerator = "native"
    images = layers.OverlayLayers()
    memory_suffix: str | None = None
    # A fork's capture is dumped into RAM (nothing waits on the disk) and its copies link
    # the image files from the same RAM folder (see _links) until their pages are served.
    captures_in_memory = True
    shares_memory = False  # CRIU copies every page into each restored sandbox
    # The lazy-pages server reads the pages as the sandbox touches them, then the rest.
    fetched_lazily: tuple[str, ...] = (f"{IMAGES}/pages-*.img",)

    def __init__(self, ram_dir: Path, state_dir: Path, boot_timeout: float = 60.0) -> None:
        self.ram_dir = ram_dir
        self.boot_timeout = boot_timeout
        ram_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.cgroups = engine_groups(state_dir)
        self.hierarchy = Hierarchy.detect()
        self._criu: criu_tools.Criu | None = None
        self.hook = state_dir / "run" / "criu-hook.sh"  # private: the engine's runtime folder
        self.shims = ShimPool(self.cgroups, state_dir / "run" / "shims.log")

    # -- what it is ----------------------------------------------------------------------

    def unavailable(self) -> str | None:
        """Why container sandboxes cannot run here, in one line (``None``: they can)."""
        return unavailable()

    def criu(self) -> criu_tools.Criu:
        """The CRIU this backend runs (found once)."""
        if self._criu is None:
            self._criu = criu_tools.require()
            self.hook.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.hook.write_text(_HOOK.format(python=sys.executable))
            self.hook.chmod(0o700)
        return self._criu

    def machine_key(self) -> str:
        """CRIU's version, the revision of our sandboxes' layout, and what a launched
        sandbox is given (its init command and environment, the guest agent's files): a
        capture holds them all."""
        agent = agent_dir()
        launched = json.dumps([INIT_COMMAND, guest_env()], sort_keys=True)
        inputs = files_hash([(str(p), agent / p) for p in agent_files(agent)]) + launched
        digest = hashlib.sha256(inputs.encode()).hexdigest()[:12]
        return f"criu {self.criu().version} / container revision {CONTAINER_REVISION} / {digest}"

    def spec(self, template: BuiltTemplate, memory_mb: int, cpu: int) -> MachineSpec:
        """A container of ``template`` (its tree made first, once)."""
        tree = tree_of(template)
        return MachineSpec(self.name, memory_mb, cpu, self.accelerator, {"tree": str(tree)})

    def base_disk(self, template: BuiltTemplate) -> Path:
        """The template's tree, the bottom of every sandbox's layers."""
        return tree_of(template)

    # -- starting ------------------------------------------------------------------------

    def _sockets(self, directory: Path) -> dict[str, Path]:
        return {s[1:]: self.ram_dir / f"{directory.name}{s}" for s in SOCKET_SUFFIXES}

    def _links(self, directory: Path, images: Path | None = None) -> Path:
        """Where a sandbox restored from ``images`` links their files: hard links need the
        same file system, so beside its sockets in RAM for a capture there, else in its
        folder."""
        if images is not None and images.stat().st_dev != self.ram_dir.stat().st_dev:
            return directory / IMAGES
        return self.ram_dir / f"{directory.name}{IMAGE_LINKS}"

    def _cgroup(self, directory: Path) -> Cgroup:
        return Cgroup(self.hierarchy, f"{self.cgroups}/{directory.name}")

    async def _start(
        self,
        spec: MachineSpec,
        directory: Path,
        disk: Path,
        spawned: Callable[[int], None] | None,
        *,
        host_access: bool,
        launch: LaunchConfig | None = None,
        restore: RestoreConfig | None = None,
    ) -> ContainerSandbox:
        if host_access:  # the engine refuses it before (engine/backends.py)
            raise ContainerError("host_access needs the vm backend")
        criu = self.criu()
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        (directory / "root").mkdir(exist_ok=True)
        cgroup = self._cgroup(directory)
        cgroup.create(Limits.for_sandbox(spec.memory_mb, spec.cpu))
        sockets = self._sockets(directory)
        config = ShimConfig(
            dir=str(directory),
            cgroup=cgroup.relative,
            sockets={name: str(path) for name, path in sockets.items()},
            launch=launch.__dict__ if launch is not None else None,
            restore=restore.__dict__ if restore is not None else None,
        )
        return await ContainerSandbox.start(
            config,
            self.shims,
            disk=disk,
            sockets=sockets,
            links=self._links(directory),
            cgroup=cgroup,
            criu=criu,
            hook=self.hook,
            timeout=self.boot_timeout,
            spawned=spawned,
        )

    def _root(self, directory: Path, disk: Path) -> dict[str, object]:
        chain = layers.chain(disk)
        return {
            "root": str(directory / "root"),
            "upper": str(disk / layers.FS),
            "work": str(disk / layers.WORK),
            "lower": [str(layers.fs_dir(layer)) for layer in chain[1:]],
        }

    async def create(
        self,
        spec: MachineSpec,
        directory: Path,
        disk: Path,
        spawned: Callable[[int], None] | None = None,
        *,
        host_access: bool = False,
    ) -> ContainerSandbox:
        """Launch a new sandbox on the layer ``disk``."""
        root = self._root(directory, disk)
        launch = LaunchConfig(
            root=str(root["root"]),
            upper=str(root["upper"]),
            work=str(root["work"]),
            lower=list(root["lower"]),  # type: ignore[call-overload]
            agent=str(agent_dir()),
            command=list(INIT_COMMAND),
            env=guest_env(),
        )
        return await self._start(
            spec, directory, disk, spawned, host_access=host_access, launch=launch
        )

    async def restore(
        self,
        start: StartPoint,
        directory: Path,
        disk: Path,
        spawned: Callable[[int], None] | None = None,
        *,
        host_access: bool = False,
    ) -> ContainerSandbox:
        """A new sandbox resuming the CRIU image in ``start.dir`` on the layer ``disk``."""
        assert start.dir is not None
        criu = self.criu()
        root = self._root(directory, disk)
        pipes = json.loads((start.dir / PIPES).read_text())
        images = start.dir / IMAGES
        restore = RestoreConfig(
            images=str(images),
            links=str(self._links(directory, images)),
            root=str(root["root"]),
            upper=str(root["upper"]),
            work=str(root["work"]),
            lower=list(root["lower"]),  # type: ignore[call-overload]
            pipes={str(k): int(v) for k, v in pipes.items()},
            criu=criu.command(),
            criu_path=criu.env()["PATH"],
            served={
                name.removeprefix(f"{IMAGES}/"): str(path) for name, path in start.served.items()
            },
        )
        sandbox = await self._start(
            start.spec, directory, disk, spawned, host_access=host_access, restore=restore
        )
        sandbox.last_layer = start.disk  # its files are that layer's until they change
        return sandbox

    async def boot_capture(self, spec: MachineSpec, template: BuiltTemplate, dest: Path) -> None:
        """Launch a sandbox of the template, start its default kernel, capture it into
        ``dest`` (``images/``, ``pipes.json``, the layer ``disk.fs``) and stop it."""
        disk = dest / f"boot{layers.SUFFIX}"
        layers.create(disk, tree_of(template))
        sandbox = await self.create(spec, dest / "boot", disk)
        try:
            await sandbox.agent.request("ctx.create", {"isolated": False})
            await sandbox.snapshot(dest, CaptureRequest(disk, [], lambda _b, _s: dest / DISK))
        finally:
            await sandbox.destroy()
            shutil.rmtree(disk, ignore_errors=True)  # the capture has a copy

    def capture_at(self, directory: Path, spec: MachineSpec) -> StartPoint:
        """The boot capture in ``directory`` as sandboxes start from it."""
        return StartPoint(directory, spec, directory / DISK, [])

    def capture_files(self, directory: Path) -> tuple[list[Path], Path]:
        """A boot capture's CRIU images and pipe list; CRIU's inventory is checksummed."""
        files = sorted((directory / IMAGES).iterdir()) if (directory / IMAGES).is_dir() else []
        return [*files, directory / PIPES], directory / IMAGES / "inventory.img"

    # -- after a restart -----------------------------------------------------------------

    async def adopt(self, directory: Path, disk: Path, pid: int) -> ContainerSandbox:
        """Re-attach to the shim of a sandbox an earlier engine started."""
        try:
            record = json.loads((directory / RECORD).read_text())
        except (OSError, ValueError) as e:
            raise ContainerError(f"it has no shim record ({e})") from e
        if record.get("shim") != pid or start_time(pid) != record.get("shim_start"):
            raise ContainerError("its shim is gone")
        sandbox = ContainerSandbox(
            directory,
            disk,
            self._sockets(directory),
            self._links(directory),
            self._cgroup(directory),
            self.criu(),
            self.hook,
            pid,
        )
        if not sandbox.is_alive():
            raise ContainerError(sandbox.failure_reason() or "it has ended")
        await sandbox.thaw()  # one an earlier engine paused goes on, as a VM's adopt does
        await sandbox.agent.connect(timeout=ADOPT_WAIT_S, alive=sandbox.is_alive)
        return sandbox

    def release(self, directory: Path) -> None:
        """Delete the group, sockets and folder of a sandbox whose shim is gone."""
        with contextlib.suppress(OSError):
            self._cgroup(directory).remove()
        for path in self._sockets(directory).values():
            path.unlink(missing_ok=True)
        shutil.rmtree(self._links(directory), ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)

    def sweep(self, root: Path, keep: set[str]) -> list[str]:
        """Stop every shim, group and folder under ``root`` no adopted sandbox owns.

        Shims are found by their command lines and working directories, not their records:
        an engine killed right after starting one may have left it before it wrote its
        record. One still waiting for a sandbox (an earlier engine's) goes too.
        """
        gone = []
        for pid, folder in shims(self.cgroups):
            if pid == self.shims.waiting_pid() or (folder is not None and folder.name in keep):
                continue
            if folder is None or folder.parent == root:
                kill_process(pid)
                gone.append(f"shim process {pid} ({folder.name if folder else 'waiting'})")
        for directory in list(root.iterdir()) if root.exists() else []:
            if directory.name not in keep and (directory / "shim.log").exists():
                self.release(directory)
                gone.append(f"directory {directory}")
        for name in self.hierarchy.groups(self.cgroups):
            if name not in keep:
                with contextlib.suppress(OSError):
                    Cgroup(self.hierarchy, f"{self.cgroups}/{name}").remove()
                    gone.append(f"control group {self.cgroups}/{name}")
        for path in list(self.ram_dir.iterdir()):
            if path.stem in keep:
                continue
            if path.suffix in SOCKET_SUFFIXES:
                path.unlink(missing_ok=True)
            elif path.suffix == IMAGE_LINKS:
                shutil.rmtree(path, ignore_errors=True)
                gone.append(f"image links {path}")
        return gone
