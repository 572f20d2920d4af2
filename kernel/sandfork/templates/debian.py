"""The host's Debian tooling: the apt mirror, package versions, downloads and unpacking.

Nothing here hard-codes a mirror: the archive is read from the machine's own apt sources
(``/etc/apt/sources.list``, ``sources.list.d/*.list`` and ``*.sources``), or taken from
``$SANDFORK_APT_MIRROR``.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import TemplateError
from .proc import run

__all__ = [
    "AptSource",
    "Package",
    "apt_mirror",
    "deb_path",
    "download_debs",
    "extract_deb",
    "parse_deb822_sources",
    "parse_one_line_sources",
    "read_apt_sources",
    "resolve_packages",
]

OnLine = Callable[[str], None] | None

# --- apt sources ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AptSource:
    """One (type, URI, suite) of an apt source entry."""

    type: str
    uri: str
    suite: str
    components: tuple[str, ...]


def parse_one_line_sources(text: str) -> list[AptSource]:
    """Entries of a one-line-style ``sources.list`` (``deb [opts] URI suite comp...``)."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)  # drop [arch=amd64 signed-by=...]
        fields = line.split()
        if len(fields) < 3 or fields[0] not in ("deb", "deb-src"):
            continue
        out.append(AptSource(fields[0], fields[1], fields[2], tuple(fields[3:])))
    return out


def parse_deb822_sources(text: str) -> list[AptSource]:
    """Entries of a deb822-style ``*.sources`` file (``Types:``/``URIs:``/``Suites:``...)."""
    out = []
    paragraphs: list[dict[str, str]] = [{}]
    last: str | None = None
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if paragraphs[-1]:
                paragraphs.append({})
            last = None
            continue
        if raw[0] in " \t":
            if last is not None:
                paragraphs[-1][last] += "\n" + raw.strip()
            continue
        key, sep, value = raw.partition(":")
        if not sep:
            continue
        last = key.strip().lower()
        paragraphs[-1][last] = value.strip()
    for p in paragraphs:
        if not p or p.get("enabled", "yes").strip().lower() == "no":
            continue
        comps = tuple(p.get("components", "").split())
        for typ in p.get("types", "").split():
            for uri in p.get("uris", "").split():
                for suite in p.get("suites", "").split():
                    out.append(AptSource(typ, uri, suite, comps))
    return out


def read_apt_sources(etc_apt: Path = Path("/etc/apt")) -> list[AptSource]:
    """All entries of the apt configuration under ``etc_apt``, in apt's reading order."""
    entries: list[AptSource] = []
    main_list = etc_apt / "sources.list"
    if main_list.is_file():
        entries += parse_one_line_sources(main_list.read_text(errors="replace"))
    parts = etc_apt / "sources.list.d"
    if parts.is_dir():
        for f in sorted(parts.iterdir()):
            if f.suffix == ".list":
                entries += parse_one_line_sources(f.read_text(errors="replace"))
            elif f.suffix == ".sources":
                entries += parse_deb822_sources(f.read_text(errors="replace"))
    return entries


def apt_mirror(suite: str, etc_apt: Path = Path("/etc/apt")) -> str:
    """The URI of the Debian archive to bootstrap ``suite`` from.

    ``$SANDFORK_APT_MIRROR`` wins. Otherwise the first binary (``deb``) entry with the
    ``main`` component whose suite is ``suite``; failing that, the first one whose suite is
    a plain release name (no ``-security``/``-updates``/``-backports`` suffix).
    """
    override = os.environ.get("SANDFORK_APT_MIRROR")
    if override:
        return override.rstrip("/")
    candidates = [
        e
        for e in read_apt_sources(etc_apt)
        if e.type == "deb"
        and "main" in e.components
        and re.match(r"^(https?|file)://", e.uri)
        and "/" not in e.suite
    ]
    for e in candidates:
        if e.suite == suite:
            return e.uri.rstrip("/")
    for e in candidates:
        if "-" not in e.suite and "security" not in e.uri:
            return e.uri.rstrip("/")
    raise TemplateError(
        f"no Debian archive with the 'main' component found in {etc_apt}/sources.list or"
        f" {etc_apt}/sources.list.d/; add one or set SANDFORK_APT_MIRROR"
    )


# --- package versions ----------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    """A Debian binary package at one version."""

    name: str
    version: str

    @property
    def file_stem(self) -> str:
        """``name_version`` as ``apt-get download`` spells it (epoch ':' as ``%3a``)."""
        return f"{self.name}_{self.version.replace(':', '%3a')}"


def _parse_show(text: str) -> dict[str, dict[str, str]]:
    """``apt-cache show`` output -> package -> fields (first stanza per package wins)."""
    out: dict[str, dict[str, str]] = {}
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            k, _, v = line.partition(":")
            fields[k.strip()] = v.strip()
        if "Package" in fields:
            out.setdefault(fields["Package"], fields)
    return out


def _apt_state_stamp() -> list[object]:
    """Cheap fingerprint of apt's package lists and sources (changes on apt-get update)."""
    stamp: list[object] = []
    for d in (Path("/var/lib/apt/lists"), Path("/etc/apt/sources.list.d")):
        try:
            for f in sorted(d.iterdir()):
                st = f.stat()
                stamp.append([str(f), st.st_mtime_ns, st.st_size])
        except OSError:
            pass
    for f in (Path("/etc/apt/sources.list"),):
        try:
            stamp.append([str(f), f.stat().st_mtime_ns])
        except OSError:
            pass
    return stamp


def _apt_show(names: list[str], *, allow_update: bool) -> dict[str, dict[str, str]]:
    result = run(
        ["apt-cache", "show", "--no-all-versions", *names],
        what="apt-cache show",
        merge_stderr=False,
        check=False,
    )
    info = _parse_show(result.stdout)
    if all(n in info for n in names):
        return info
    if allow_update:
        run(["apt-get", "update"], what="apt-get update")
        return _apt_show(names, allow_update=False)
    missing = [n for n in names if n not in info]
    raise TemplateError(
        f"apt does not know the package(s) {', '.join(missing)}"
        + (f"\n{result.stderr.strip()}" if result.stderr.strip() else "")
    )


def resolve_packages(
    names: Iterable[str],
    *,
    follow: Iterable[str] = (),
    memo: Path | None = None,
    allow_update: bool = True,
) -> dict[str, Package]:
    """Candidate versions of the packages ``names``, keyed by the names given.

    A name also listed in ``follow`` is a metapackage (e.g. ``linux-image-cloud-amd64``):
    it resolves to the package its first ``Depends`` names. ``apt-cache`` is slow on hosts
    without apt's binary cache (about 1 s a call), so the result is memoised in the JSON file
    ``memo`` for as long as apt's lists and sources are unchanged. ``apt-get update`` is run
    (once) only if apt knows nothing of a package and ``allow_update`` is set.
    """
    wanted = list(names)
    meta = sorted(set(follow))
    stamp = _apt_state_stamp()
    memo_key = {"names": wanted, "follow": meta}
    if memo is not None:
        try:
            data = json.loads(memo.read_text())
            if data.get("stamp") == stamp and data.get("key") == memo_key:
                return {k: Package(**v) for k, v in data["packages"].items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass
    info = _apt_show(wanted, allow_update=allow_update)
    resolved: dict[str, Package] = {}
    for name in wanted:
        fields = info[name]
        if name not in meta:
            resolved[name] = Package(fields["Package"], fields["Version"])
            continue
        dep = fields.get("Depends", "").split(",")[0].strip()
        m = re.match(r"^([a-z0-9][a-z0-9+.-]+)(?:\s*\(\s*=\s*([^)\s]+)\s*\))?", dep)
        if not m:
            raise TemplateError(f"cannot resolve the metapackage {name}: Depends is {dep!r}")
        if m.group(2):
            resolved[name] = Package(m.group(1), m.group(2))
        else:
            real = _apt_show([m.group(1)], allow_update=False)[m.group(1)]
            resolved[name] = Package(real["Package"], real["Version"])
    if memo is not None:
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        payload = {
            "stamp": _apt_state_stamp(),
            "key": memo_key,
            "packages": {k: vars(v) for k, v in resolved.items()},
        }
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, memo)
    return resolved


# --- downloads -----------------------------------------------------------------------------


def deb_path(debs_dir: Path, pkg: Package) -> Path | None:
    """The cached ``.deb`` of ``pkg`` in ``debs_dir``, if present."""
    for f in sorted(debs_dir.glob(f"{pkg.file_stem}_*.deb")):
        return f
    return None


def download_debs(pkgs: Iterable[Package], debs_dir: Path, on_line: OnLine = None) -> list[Path]:
    """The ``.deb`` files of ``pkgs``, downloaded with ``apt-get download`` if not cached.

    The download runs in a temp directory the ``_apt`` user can write to (so apt keeps its
    sandbox), then the files are moved into ``debs_dir``.
    """
    pkgs = list(pkgs)
    missing = [p for p in pkgs if deb_path(debs_dir, p) is None]
    if missing:
        tmp = debs_dir / f".dl-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            if os.geteuid() == 0:
                try:
                    os.chown(tmp, pwd.getpwnam("_apt").pw_uid, -1)
                except KeyError:
                    pass
            run(
                ["apt-get", "download", *(f"{p.name}={p.version}" for p in missing)],
                what="apt-get download",
                cwd=tmp,
                on_line=on_line,
            )
            for f in tmp.glob("*.deb"):
                os.replace(f, debs_dir / f.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    paths = []
    for p in pkgs:
        path = deb_path(debs_dir, p)
        if path is None:
            raise TemplateError(f"apt-get download did not produce {p.file_stem}_*.deb")
        paths.append(path)
    return paths


def extract_deb(deb: Path, dest: Path) -> None:
    """Unpack the files of ``deb`` into ``dest`` (``dpkg-deb -x``, no root needed)."""
    dest.mkdir(parents=True, exist_ok=True)
    run(["dpkg-deb", "-x", str(deb), str(dest)], what=f"unpacking {deb.name}")
