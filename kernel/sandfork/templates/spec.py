"""Template specs: the declarative TOML description of a sandbox image.

A spec file looks like::

    name = "code-interpreter"
    description = "Python with the data stack and a Jupyter kernel"
    base = "debian:bookworm"
    apt = ["git"]
    pip = ["ipykernel", "numpy"]
    setup = ["echo done > /etc/motd"]
    disk_size_mb = 4096
    memory_mb = 1024
    cpu = 2

    [files]
    "/etc/sandfork/hello.txt" = "hello\\n"

Fields (all optional but ``name``, which defaults to the file name):

- ``base``: the Debian release to bootstrap; only ``"debian:bookworm"`` (Python 3.11).
- ``apt``: Debian packages added to the minimal system (which always has python3, venv,
  tini, ca-certificates, iproute2, procps).
- ``pip``: requirements installed into ``/opt/venv`` (binary wheels only: they are downloaded
  on the host for the guest's Python and installed offline). The guest agent needs
  ``jupyter_client`` (from ``ipykernel``) for code contexts.
- ``files``: guest path -> content, written after the packages.
- ``setup``: shell commands run in the image with ``/bin/sh -c`` after the files, as root,
  with ``/opt/venv/bin`` first on ``PATH`` and the host's network and CA certificates.
- ``disk_size_mb``: size of the root filesystem (the qcow2 image is sparse).
- ``memory_mb`` (at least ``protocol.MIN_MEMORY_MB``), ``cpu``: defaults for sandboxes of
  this template (not build inputs). ``cpus`` is read as ``cpu`` (its name before the wire's
  was taken for both).

Builtin specs live in ``builtin/*.toml`` next to this module; user specs in
``sandfork.paths.user_templates_dir()`` (a user spec with a builtin's name takes precedence).
"""

from __future__ import annotations

import logging
import posixpath
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..paths import user_templates_dir
from ..protocol import DEFAULT_MEMORY_MB, MIN_MEMORY_MB
from .errors import TemplateError

__all__ = [
    "SUPPORTED_BASES",
    "BaseImage",
    "TemplateSpec",
    "builtin_templates_dir",
    "check_template_name",
    "list_specs",
    "load_spec",
    "parse_spec",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BaseImage:
    """A supported ``base``: which Debian suite to bootstrap and its Python version."""

    suite: str
    python_version: str


#: The bases a spec may name. Wheels are downloaded for ``python_version``.
SUPPORTED_BASES: dict[str, BaseImage] = {
    "debian:bookworm": BaseImage(suite="bookworm", python_version="3.11"),
}

BACKENDS = ("auto", "vm", "container")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_APT_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


@dataclass(frozen=True)
class TemplateSpec:
    """A parsed, validated template spec.

    Only ``base``, ``apt``, ``pip``, ``files``, ``setup`` and ``disk_size_mb`` go into the
    image; ``description``, ``memory_mb``, ``cpu`` and ``backend`` are metadata and sandbox
    defaults, so changing them does not rebuild anything.
    """

    name: str
    description: str = ""
    base: str = "debian:bookworm"
    apt: tuple[str, ...] = ()
    pip: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    disk_size_mb: int = 4096
    memory_mb: int = DEFAULT_MEMORY_MB
    cpu: int = 2
    backend: str = "auto"  # what runs its sandboxes: auto, vm or container
    source: Path | None = field(default=None, compare=False)

    @property
    def base_image(self) -> BaseImage:
        """The ``SUPPORTED_BASES`` entry of ``base``."""
        return SUPPORTED_BASES[self.base]

    def build_inputs(self) -> dict[str, Any]:
        """The fields that determine the built image, in a canonical form.

        apt packages are a set (sorted, deduplicated); pip requirements and setup commands
        keep their order, which can matter; files are sorted by path.
        """
        return {
            "base": self.base,
            "apt": sorted(set(self.apt)),
            "pip": list(self.pip),
            "files": dict(sorted(self.files.items())),
            "setup": list(self.setup),
            "disk_size_mb": self.disk_size_mb,
        }

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain data (the TOML document it could have come from)."""
        return {
            "name": self.name,
            "description": self.description,
            "base": self.base,
            "apt": list(self.apt),
            "pip": list(self.pip),
            "files": dict(self.files),
            "setup": list(self.setup),
            "disk_size_mb": self.disk_size_mb,
            "memory_mb": self.memory_mb,
            "cpu": self.cpu,
            "backend": self.backend,
        }


# --- parsing -------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "a list",
        dict: "a table",
    }
    return names.get(type(value), type(value).__name__)


class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, fieldname: str, problem: str) -> TemplateError:
        return TemplateError(f"{self.where}: field '{fieldname}': {problem}")

    def string(self, fieldname: str, value: object) -> str:
        if not isinstance(value, str):
            raise self.fail(fieldname, f"expected a string, got {_type_name(value)}")
        return value

    def integer(self, fieldname: str, value: object, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(fieldname, f"expected an integer, got {_type_name(value)}")
        if not lo <= value <= hi:
            raise self.fail(fieldname, f"must be between {lo} and {hi}, got {value}")
        return value

    def strings(
        self, fieldname: str, value: object, check: Callable[[str], str | None]
    ) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(fieldname, f"expected a list of strings, got {_type_name(value)}")
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail(f"{fieldname}[{i}]", f"expected a string, got {_type_name(item)}")
            problem = check(item)
            if problem:
                raise self.fail(f"{fieldname}[{i}]", f"{problem}: {item!r}")
            out.append(item)
        return tuple(out)


def _check_apt(item: str) -> str | None:
    if not _APT_RE.match(item):
        return "not a Debian package name"
    return None


def _check_pip(item: str) -> str | None:
    if not item.strip():
        return "empty requirement"
    if item.lstrip().startswith("-"):
        return "pip options are not allowed, only requirements"
    if "\n" in item:
        return "a requirement must be one line"
    return None


def _check_command(item: str) -> str | None:
    return "empty command" if not item.strip() else None


def _check_guest_path(path: str) -> str | None:
    if not path.startswith("/"):
        return "must be an absolute path"
    if path.endswith("/") or posixpath.normpath(path) != path or "/../" in path + "/":
        return "must be a normalized path to a file (no '..', '//' or trailing '/')"
    if "\0" in path or "\n" in path:
        return "contains a NUL or newline"
    return None


_FIELDS = (
    "name",
    "description",
    "base",
    "apt",
    "pip",
    "files",
    "setup",
    "disk_size_mb",
    "memory_mb",
    "cpu",
    "cpus",
    "backend",
)


def parse_spec(text: str, source: Path | str | None = None) -> TemplateSpec:
    """Parse and validate the TOML ``text`` of a spec.

    ``source`` (a path) is used in error messages and, when the spec has no ``name``, its
    file stem becomes the name. Raises ``TemplateError`` naming the file and the field.
    """
    src_path = Path(source) if source is not None else None
    where = str(src_path) if src_path is not None else "<template spec>"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TemplateError(f"{where}: invalid TOML: {e}") from e
    c = _Checker(where)
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise TemplateError(
            f"{where}: unknown field '{unknown[0]}' (known fields: {', '.join(_FIELDS)})"
        )

    if "name" in data:
        name = c.string("name", data["name"])
    elif src_path is not None:
        name = src_path.stem
    else:
        raise c.fail("name", "missing")
    if not _NAME_RE.match(name):
        raise c.fail(
            "name",
            f"{name!r} is not a valid template name (lowercase letters, digits, '.', '_', '-';"
            " at most 63 characters)",
        )

    base = c.string("base", data.get("base", "debian:bookworm"))
    if base not in SUPPORTED_BASES:
        raise c.fail(
            "base", f"unsupported base {base!r} (supported: {', '.join(sorted(SUPPORTED_BASES))})"
        )

    files_raw = data.get("files", {})
    if not isinstance(files_raw, dict):
        raise c.fail("files", f"expected a table of path = content, got {_type_name(files_raw)}")
    files: dict[str, str] = {}
    for path, content in files_raw.items():
        problem = _check_guest_path(path)
        if problem:
            raise c.fail(f"files.{path!r}", problem)
        if not isinstance(content, str):
            raise c.fail(
                f"files.{path!r}",
                f"expected the file content as a string, got {_type_name(content)}",
            )
        files[path] = content

    return TemplateSpec(
        name=name,
        description=c.string("description", data.get("description", "")),
        base=base,
        apt=c.strings("apt", data.get("apt", []), _check_apt),
        pip=c.strings("pip", data.get("pip", []), _check_pip),
        files=files,
        setup=c.strings("setup", data.get("setup", []), _check_command),
        disk_size_mb=c.integer("disk_size_mb", data.get("disk_size_mb", 4096), 512, 1 << 20),
        memory_mb=c.integer(
            "memory_mb", data.get("memory_mb", DEFAULT_MEMORY_MB), MIN_MEMORY_MB, 1 << 20
        ),
        cpu=_cpu(c, data),
        backend=_backend(c, data.get("backend", "auto")),
        source=src_path,
    )


def _cpu(c: _Checker, data: dict[str, Any]) -> int:
    """``cpu``, or ``cpus`` (its earlier name); both at once is a mistake worth saying."""
    if "cpu" in data and "cpus" in data:
        raise c.fail("cpus", "give 'cpu' only ('cpus' is its earlier name)")
    name = "cpus" if "cpus" in data else "cpu"
    return c.integer(name, data.get(name, 2), 1, 256)


def _backend(c: _Checker, value: object) -> str:
    backend = c.string("backend", value)
    if backend not in BACKENDS:
        raise c.fail("backend", f"expected one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


# --- finding specs -------------------------------------------------------------------------


def builtin_templates_dir() -> Path:
    """Directory of the specs shipped with Sandfork."""
    return Path(__file__).resolve().parent / "builtin"


def _read_spec_file(path: Path) -> TemplateSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TemplateError(f"{path}: cannot read template spec: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise TemplateError(f"{path}: template spec is not UTF-8 text: {e}") from e
    return parse_spec(text, path)


def _spec_files() -> dict[str, Path]:
    """name (file stem) -> file; user specs override builtin ones."""
    found: dict[str, Path] = {}
    for directory in (builtin_templates_dir(), user_templates_dir()):
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found[path.stem] = path
    return found


def check_template_name(name: str) -> str:
    """``name`` if it is a valid template name, else a ``TemplateError`` (echoing the name,
    never a file)."""
    if not _NAME_RE.fullmatch(name):
        raise TemplateError(
            f"bad template name {name[:100]!r}: a template is named, not pathed (lowercase"
            " letters, digits, '.', '_', '-'; at most 63 characters)"
        )
    return name


def load_spec(name_or_path: str | Path) -> TemplateSpec:
    """Load a spec by template name (user specs first, then builtin), or from a file.

    A string is only ever a template name (see :func:`check_template_name`): one that looks
    like a path is refused without touching the file system, so names from untrusted callers
    are safe to pass. Only a ``Path`` object is read as a spec file.
    """
    if isinstance(name_or_path, Path):
        path = name_or_path.expanduser()
        if not path.is_file():
            raise TemplateError(f"{path}: template spec file not found")
        return _read_spec_file(path)
    files = _spec_files()
    path_for_name = files.get(check_template_name(name_or_path))
    if path_for_name is None:
        known = ", ".join(sorted(files)) or "none"
        raise TemplateError(f"unknown template {name_or_path!r} (known templates: {known})")
    spec = _read_spec_file(path_for_name)
    if spec.name != name_or_path:
        raise TemplateError(
            f"{path_for_name}: field 'name': {spec.name!r} does not match the file name"
            f" {path_for_name.name!r}"
        )
    return spec


def list_specs(*, strict: bool = False) -> list[TemplateSpec]:
    """All builtin and user specs, sorted by name.

    An invalid user spec is skipped with a logged warning, or raises with ``strict``.
    """
    specs = []
    for name, path in sorted(_spec_files().items()):
        try:
            specs.append(load_spec(name))
        except TemplateError as e:
            if strict:
                raise
            log.warning("skipping template spec %s: %s", path, e)
    return specs
