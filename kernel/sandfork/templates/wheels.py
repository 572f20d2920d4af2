"""pip on the host: its index configuration (passed to the guest) and wheel downloads.

Wheels are downloaded on the host, for the guest's Python and platform, and installed
offline in the chroot: no network or certificate setup is needed inside the chroot.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import TemplateError
from .proc import run

__all__ = [
    "PLATFORMS",
    "download_wheels",
    "guest_pip_conf",
    "host_index_urls",
    "host_pip",
    "parse_pip_config_list",
]

#: Platform tags accepted for the guest (glibc 2.36 on bookworm, x86_64).
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "linux_x86_64",
)

#: Where the guest's CA bundle is; pip in the guest is pointed at it.
GUEST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

# pip's precedence, highest first.
_VARIANTS = (":env:", "site", "user", "global")


def host_pip() -> list[str]:
    """The command that runs the host's pip (this interpreter's, else ``python3``'s)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    python3 = shutil.which("python3")
    if python3:
        return [python3, "-m", "pip"]
    raise TemplateError("no pip on the host: install python3-pip (needed to download wheels)")


def parse_pip_config_list(text: str) -> dict[str, list[str]]:
    """``pip config list`` output -> ``index-url``/``extra-index-url`` -> http(s) URLs.

    ``index-url`` is the one of the highest-precedence scope; ``extra-index-url`` collects
    all scopes. ``file://`` and other non-http(s) URLs are dropped (they are host paths).
    """
    found: dict[str, dict[str, list[str]]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        scope, _, option = key.strip().rpartition(".")
        option = option.strip()
        if option not in ("index-url", "extra-index-url"):
            continue
        value = value.strip().strip("'\"")
        urls = [u for u in value.split() if u.startswith(("http://", "https://"))]
        found.setdefault(option, {})[scope] = urls
    out: dict[str, list[str]] = {}
    index = found.get("index-url", {})
    for scope in _VARIANTS:
        if index.get(scope):
            out["index-url"] = index[scope][:1]
            break
    extra: list[str] = []
    for scope in _VARIANTS:
        for url in found.get("extra-index-url", {}).get(scope, []):
            if url not in extra:
                extra.append(url)
    if extra:
        out["extra-index-url"] = extra
    return out


def host_index_urls() -> dict[str, list[str]]:
    """The host pip's http(s) index configuration (see ``parse_pip_config_list``)."""
    result = run([*host_pip(), "config", "list"], what="pip config list", check=False)
    return parse_pip_config_list(result.stdout) if result.returncode == 0 else {}


def guest_pip_conf(index: dict[str, list[str]]) -> str:
    """The guest's ``/etc/pip.conf``: the host's index URLs and the system CA bundle."""
    lines = ["[global]", f"cert = {GUEST_CA_BUNDLE}"]
    if index.get("index-url"):
        lines.append(f"index-url = {index['index-url'][0]}")
    if index.get("extra-index-url"):
        lines.append("extra-index-url = " + "\n    ".join(index["extra-index-url"]))
    return "\n".join(lines) + "\n"


def download_wheels(
    requirements: Sequence[str],
    python_version: str,
    dest: Path,
    on_line: Callable[[str], None] | None = None,
) -> list[Path]:
    """Download binary wheels of ``requirements`` (and their dependencies) into ``dest``."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    run(
        [
            *host_pip(),
            "download",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            *platforms,
            "-d",
            str(dest),
            *requirements,
        ],
        what="pip download",
        on_line=on_line,
    )
    return sorted(dest.glob("*.whl"))
