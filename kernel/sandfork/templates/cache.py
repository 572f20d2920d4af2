"""The artifact cache: keys, atomic staging, manifests, the build lock and stale cleanup.

Layout under ``sandfork.paths.cache_dir()``::

    build.lock                 flock'ed while anything is built
    apt-packages.json          memo of apt-cache answers (valid while apt's lists are unchanged)
    debs/                      downloaded .deb files (also debootstrap's --cache-dir)
    wheels/<hash>/             wheels downloaded on the host for one pip requirement set
    boot/<key16>/              vmlinuz, vmlinux (PVH), initrd.img, manifest.json
    rootfs/<name>-<key16>/     rootfs.qcow2, manifest.json

Templates installed for every user (``sandfork template import --into``, by root) live in
the same layout in read-only folders (``shared_template_dirs``), which are searched after
the user's own cache and never written.

An artifact is built in a sibling ``.tmp-*`` directory; ``manifest.json`` is written last,
then the directory is renamed into place. Only a directory with a manifest counts as
built, so an interrupted build (Ctrl-C, SIGKILL) never leaves anything that looks complete,
and the ``.tmp-*`` leftovers are removed by the next build (under the lock, when no other
build can be running).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from ..paths import cache_dir
from .chroot import safe_rmtree
from .errors import TemplateError

__all__ = [
    "MANIFEST",
    "TMP_PREFIX",
    "Staging",
    "build_lock",
    "clean_stale",
    "hash_key",
    "read_manifest",
    "sandfork_cache",
    "shared_template_dirs",
    "template_roots",
]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
_AREAS = ("debs", "wheels", "boot", "rootfs")
SHARED_TEMPLATES = Path("/usr/share/sandfork/templates")
"""Where templates installed for every user are, unless ``$SANDFORK_TEMPLATE_PATH`` says."""


def sandfork_cache() -> Path:
    """``cache_dir()``, created with its subdirectories."""
    root = cache_dir()
    for area in _AREAS:
        (root / area).mkdir(parents=True, exist_ok=True)
    return root


def shared_template_dirs() -> list[Path]:
    """Read-only folders of templates installed for every user: ``$SANDFORK_TEMPLATE_PATH``
    (folders separated by ``:``; empty: none), else ``/usr/share/sandfork/templates``."""
    value = os.environ.get("SANDFORK_TEMPLATE_PATH")
    if value is None:
        return [SHARED_TEMPLATES]
    return [Path(part).expanduser() for part in value.split(os.pathsep) if part]


def template_roots() -> list[Path]:
    """Where built templates are looked for, in order: the user's cache (created), then
    each existing shared folder."""
    own = sandfork_cache()
    shared = [d for d in shared_template_dirs() if d.is_dir() and d.resolve() != own.resolve()]
    return [own, *shared]


def hash_key(inputs: Any) -> str:
    """sha256 hex digest of ``inputs`` as canonical JSON (dict order does not matter)."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def read_manifest(artifact_dir: Path) -> dict[str, Any] | None:
    """The manifest of a complete artifact, or None if ``artifact_dir`` is not one."""
    try:
        data = json.loads((artifact_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Staging:
    """A temp directory next to ``final`` that becomes ``final`` on ``commit``.

    Use as a context manager: leaving the block without ``commit`` (an exception, Ctrl-C)
    removes the temp directory.
    """

    def __init__(self, final: Path) -> None:
        self.final = final
        final.parent.mkdir(parents=True, exist_ok=True)
        self.path = final.parent / f"{TMP_PREFIX}{final.name}-{os.getpid()}-{secrets.token_hex(3)}"
        self.path.mkdir()
        self.started = time.time()
        self.committed = False

    def __enter__(self) -> Staging:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.committed:
            safe_rmtree(self.path, kill_users=True)

    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Write ``manifest.json`` (last), then move the directory into place."""
        manifest = {**manifest, "built_at": time.time(), "build_seconds": self.elapsed()}
        tmp = self.path / (MANIFEST + ".part")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path / MANIFEST)
        _fsync_dir(self.path)
        if os.path.lexists(self.final):  # an incomplete leftover (no manifest)
            if read_manifest(self.final) is not None:
                raise TemplateError(f"{self.final} was built concurrently (build lock not held?)")
            safe_rmtree(self.final)
        os.rename(self.path, self.final)
        _fsync_dir(self.final.parent)
        self.committed = True
        return manifest

    def elapsed(self) -> float:
        """Seconds since the staging directory was created."""
        return round(time.time() - self.started, 3)


@contextmanager
def build_lock(root: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the cache's exclusive build lock, waiting for another builder to finish.

    ``on_wait`` is called once if the lock is busy (e.g. to tell the person why nothing
    happens). The lock is released by the kernel if the holder dies, even by SIGKILL.
    """
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def clean_stale(root: Path) -> list[Path]:
    """Remove leftovers of interrupted builds; call only while holding ``build_lock``.

    Returns what was removed: ``.tmp-*`` directories in every area and artifact
    directories without a manifest.
    """
    removed = []
    for area in _AREAS:
        d = root / area
        if not d.is_dir():
            continue
        for entry in d.iterdir():
            stale = entry.name.startswith(TMP_PREFIX)
            if area in ("boot", "rootfs", "wheels") and entry.is_dir() and not stale:
                stale = read_manifest(entry) is None
            if stale:
                try:
                    safe_rmtree(entry, kill_users=True)
                except (OSError, TemplateError) as e:
                    # it can never be committed, so building on is safe.
                    log.warning("cannot remove stale %s yet: %s", entry, e)
                    continue
                removed.append(entry)
    return removed
