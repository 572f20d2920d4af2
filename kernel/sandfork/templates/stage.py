"""The steps after the bootstrap: CA bundle, venv, wheels, files, setup, ext4 image.

They run as root: in this process when Sandfork runs as root, else in a child process
(``python -m sandfork.templates.stage``) that is root of a user namespace (see ``userns``),
where the tree made by ``mmdebstrap --mode=unshare`` is root's own, or, where no namespace
can be made, runs under fakechroot and fakeroot and makes the tree itself first (see
``fakechroot``). One code path every way: the child reports its steps on stdout as lines
starting with ``MARK`` (a JSON event: ``start``, ``update``, ``done``, ``result``,
``error``), which the parent shows as its own steps.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from . import fakechroot
from .chroot import chroot_mounts, run_in_chroot, safe_rmtree
from .errors import TemplateError
from .proc import format_failure, run
from .progress import BuildProgress, Step
from .rootfs import (
    apt_packages,
    bootstrap,
    create_venv,
    finalize_tree,
    install_ca_bundle,
    install_wheels,
    make_image,
    run_setup,
    write_files,
    write_pip_conf,
)
from .spec import TemplateSpec
from .userns import in_namespace, namespace_ids

__all__ = ["MARK", "Bootstrap", "RootfsJob", "bootstrap_tree", "finish_rootfs", "run_finish"]

MARK = "sandfork-step:"


@dataclass(frozen=True)
class Bootstrap:
    """Where the tree's packages come from (the apt ``mirror``, the ``debs`` cache) and the
    build mode (``userns.build_mode()``)."""

    mirror: str
    debs: Path
    mode: str


def bootstrap_tree(
    spec: TemplateSpec, tree: Path, source: Bootstrap, progress: BuildProgress
) -> float:
    """Make ``tree`` with mmdebstrap: the spec's suite and packages; the step's seconds."""
    packages = apt_packages(spec.apt)
    with progress.step(f"Debian {spec.base_image.suite} (mmdebstrap)") as s:
        bootstrap(
            tree,
            suite=spec.base_image.suite,
            mirror=source.mirror,
            packages=packages,
            cache=source.debs,
            mode=source.mode,
            on_line=s.update,
        )
        python = f"python{spec.base_image.python_version}"
        if not (tree / "usr" / "bin" / python).exists():
            raise TemplateError(f"the {spec.base} tree has no /usr/bin/{python}")
        s.done(f"{len(packages)} packages and their dependencies")
    return round(s.elapsed, 2)


@dataclass(frozen=True)
class RootfsJob:
    """What the steps after the bootstrap need: the tree, the spec, the downloaded wheels,
    the guest's pip configuration, the image to write and who must own it (``owner``: the
    caller's ids inside the namespace, None when not in one); ``bootstrap`` when the tree is
    to be made first, in the same process (fakechroot)."""

    tree: Path
    spec: TemplateSpec
    wheels: Path | None
    pip_conf: str
    qcow2: Path
    owner: tuple[int, int] | None = None
    bootstrap: Bootstrap | None = None

    def to_json(self) -> str:
        """The job as JSON, for the child process."""
        return json.dumps(
            {
                "tree": str(self.tree),
                "spec": self.spec.to_dict(),
                "wheels": str(self.wheels) if self.wheels else None,
                "pip_conf": self.pip_conf,
                "qcow2": str(self.qcow2),
                "owner": list(self.owner) if self.owner else None,
                "bootstrap": (
                    {**asdict(self.bootstrap), "debs": str(self.bootstrap.debs)}
                    if self.bootstrap
                    else None
                ),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RootfsJob:
        """The job ``to_json`` wrote."""
        data = json.loads(text)
        spec = dict(data["spec"])
        for name in ("apt", "pip", "setup"):
            spec[name] = tuple(spec[name])
        return cls(
            tree=Path(data["tree"]),
            spec=TemplateSpec(**spec),
            wheels=Path(data["wheels"]) if data["wheels"] else None,
            pip_conf=data["pip_conf"],
            qcow2=Path(data["qcow2"]),
            owner=(data["owner"][0], data["owner"][1]) if data["owner"] else None,
            bootstrap=(
                Bootstrap(**{**data["bootstrap"], "debs": Path(data["bootstrap"]["debs"])})
                if data["bootstrap"]
                else None
            ),
        )


def finish_rootfs(job: RootfsJob, progress: BuildProgress) -> dict[str, Any]:
    """Run the steps after the bootstrap on ``job.tree`` (as root; the bootstrap first if
    the job has one), write ``job.qcow2`` and remove the tree; the manifest's ``timings``,
    ``pip_freeze`` and ``sizes``."""
    tree, spec = job.tree, job.spec
    timings: dict[str, float] = {}
    out: dict[str, Any] = {"timings": timings}
    if job.bootstrap is not None:
        timings["bootstrap"] = bootstrap_tree(spec, tree, job.bootstrap, progress)
    with chroot_mounts(tree):
        with progress.step("CA certificates, pip config, /opt/venv") as s:
            added = install_ca_bundle(tree)
            write_pip_conf(tree, job.pip_conf)
            create_venv(tree)
            s.done(f"{added} host CA certificate(s) added")
        timings["venv"] = round(s.elapsed, 2)
        if spec.pip and job.wheels is not None:
            with progress.step("Python packages (pip install, offline)") as s:
                install_wheels(tree, job.wheels, spec.pip, s.update)
                freeze = run_in_chroot(
                    tree, ["/opt/venv/bin/pip", "freeze", "--all"], what="pip freeze"
                ).stdout.split()
                out["pip_freeze"] = freeze
                s.done(f"{len(freeze)} distributions")
            timings["pip_install"] = round(s.elapsed, 2)
        if spec.files or spec.setup:
            with progress.step("Files and setup commands") as s:
                write_files(tree, spec.files)
                run_setup(tree, spec.setup, s.update)
                s.done(f"{len(spec.files)} files, {len(spec.setup)} commands")
            timings["setup"] = round(s.elapsed, 2)
        finalize_tree(tree)
    if fakechroot.active():
        fakechroot.fix_symlinks(tree)
    with progress.step(f"Disk image ext4 {spec.disk_size_mb} MiB -> qcow2") as s:
        sizes = make_image(tree, job.qcow2, spec.disk_size_mb, s.update)
        if job.owner is not None:  # the caller's, not its namespace root's (a subordinate id)
            os.chown(job.qcow2, *job.owner)
        safe_rmtree(tree)
        s.done(
            f"{sizes['tree_bytes'] / 2**20:.0f} MiB of files,"
            f" qcow2 {sizes['qcow2_bytes'] / 2**20:.0f} MiB"
        )
    timings["image"] = round(s.elapsed, 2)
    out["sizes"] = sizes
    return out


def run_finish(job: RootfsJob, progress: BuildProgress, mode: str) -> dict[str, Any]:
    """``finish_rootfs`` as root (``mode`` is ``userns.build_mode()``): here, or for an
    ordinary user in a user namespace, or under fakechroot and fakeroot."""
    if mode == "root":
        return finish_rootfs(job, progress)
    child = [sys.executable, "-m", "sandfork.templates.stage"]
    if mode == "unshare":
        job = replace(job, owner=namespace_ids())
        args = in_namespace(child)
    else:
        args = fakechroot.wrap(child)
    relay = _Relayed(progress)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # no root-owned .pyc in the venv
    try:
        result = run(
            args,
            what="the build steps",
            env=env,
            input=job.to_json(),
            on_line=relay.line,
            check=False,
        )
    finally:
        relay.close()
    if relay.error is not None:
        raise TemplateError(relay.error)
    if result.returncode != 0 or relay.result is None:
        raise TemplateError(
            format_failure("the build steps", args, result.returncode, "\n".join(relay.other))
        )
    return relay.result


class _Relayed:
    """The parent's side: shows the child's steps as steps of ``progress``."""

    def __init__(self, progress: BuildProgress) -> None:
        self.progress = progress
        self.step: tuple[ExitStack, Step] | None = None
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.other: list[str] = []  # lines that are not events (a traceback)

    def line(self, text: str) -> None:
        if not text.startswith(MARK):
            self.other.append(text)
            if self.step is not None:
                self.step[1].update(text)
            return
        event = json.loads(text[len(MARK) :])
        if "start" in event:
            stack = ExitStack()
            self.step = (stack, stack.enter_context(self.progress.step(event["start"])))
        elif "update" in event and self.step is not None:
            self.step[1].update(event["update"])
        elif "done" in event and self.step is not None:
            self.step[1].done(event["done"])
            self.step[0].close()
            self.step = None
        elif "result" in event:
            self.result = event["result"]
        elif "error" in event:
            self.error = event["error"]

    def close(self) -> None:
        """End a step the child did not finish, as failed."""
        if self.step is not None:
            failed = TemplateError("the step failed")
            self.step[0].__exit__(TemplateError, failed, None)
            self.step = None


class _RelayStep(Step):
    def __init__(self, relay: _Relay, title: str) -> None:
        super().__init__(None, None, title)
        self.relay = relay

    def update(self, detail: str) -> None:
        self.relay.emit(update=detail)


class _Relay(BuildProgress):
    """The child's side: its steps as events on ``out``."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(enabled=False)
        self.out = out
        self.lock = threading.Lock()

    def emit(self, **event: Any) -> None:
        with self.lock:
            self.out.write(MARK + json.dumps(event) + "\n")
            self.out.flush()

    @contextmanager
    def step(self, title: str) -> Iterator[Step]:
        self.emit(start=title)
        handle = _RelayStep(self, title)
        yield handle
        self.emit(done=handle.summary)


def main() -> int:
    """The child: read a ``RootfsJob`` on stdin, run it, report on stdout."""
    job = RootfsJob.from_json(sys.stdin.read())
    relay = _Relay(sys.stdout)
    try:
        relay.emit(result=finish_rootfs(job, relay))
        return 0
    except TemplateError as e:
        relay.emit(error=str(e))
        return 1
    finally:
        safe_rmtree(job.tree)  # ours to remove: outside, it belongs to subordinate ids


if __name__ == "__main__":
    sys.exit(main())
