"""The root filesystem: mmdebstrap, CA bundle, venv, wheels, files, setup, ext4 image.

Every function works on a directory ``tree`` being built; the builder calls them in order,
with ``/proc`` mounted in the tree (``chroot.chroot_mounts``) for the chroot steps.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .chroot import run_in_chroot, safe_rmtree
from .errors import TemplateError
from .proc import run

__all__ = [
    "HOST_CA_BUNDLE",
    "REQUIRED_APT",
    "apt_packages",
    "bootstrap",
    "create_venv",
    "finalize_tree",
    "install_ca_bundle",
    "install_wheels",
    "make_image",
    "run_setup",
    "tree_size",
    "write_files",
    "write_pip_conf",
]

OnLine = Callable[[str], None] | None

#: Packages every template gets: the agent's Python and venv, tini as PID 1, CA
#: certificates, ``ip`` for the network setup, ``ps``/``kill``.
REQUIRED_APT = ("python3", "python3-venv", "tini", "ca-certificates", "iproute2", "procps")

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
GUEST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
VENV = "/opt/venv"
FS_LABEL = "sandfork-root"

_PEM_RE = re.compile(r"-----BEGIN CERTIFICATE-----\s*(.*?)\s*-----END CERTIFICATE-----", re.DOTALL)


def apt_packages(apt: Sequence[str]) -> list[str]:
    """What the bootstrap installs: ``REQUIRED_APT``, then a spec's ``apt`` (sorted)."""
    return list(dict.fromkeys([*REQUIRED_APT, *sorted(set(apt))]))


def _in_tree(tree: Path, guest_path: str) -> Path:
    return tree / guest_path.lstrip("/")


def bootstrap(
    tree: Path,
    *,
    suite: str,
    mirror: str,
    packages: Sequence[str],
    cache: Path,
    mode: str,
    on_line: OnLine = None,
) -> None:
    """``mmdebstrap --variant=minbase`` of ``suite`` into ``tree`` with ``packages``.

    ``mode`` is ``userns.build_mode()``: as root the tree is root's (``root``); as anyone
    else it is made in a user namespace (``unshare``) and owned by the caller's subordinate
    ids, so the later steps must run in one too (see ``stage``), or (``fakechroot``) owned by
    the caller, with the owners fakeroot recorded, in the fakechroot session of the later
    steps. Downloaded packages are kept in ``cache`` (copied in before, out after), so a
    rebuild downloads only what changed.
    """
    cache = cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    archives = "/var/cache/apt/archives"
    run(
        [
            "mmdebstrap",
            f"--mode={mode}",
            "--variant=minbase",
            "--format=directory",
            f"--include={','.join(packages)}",
            "--skip=essential/unlink",  # keep the essential .debs for the cache too
            f'--setup-hook=mkdir -p "$1"{archives}/',
            f"--setup-hook=sync-in {shlex.quote(str(cache))} {archives}/",
            f"--customize-hook=sync-out {archives} {shlex.quote(str(cache))}",
            suite,
            str(tree),
            mirror,
        ],
        what=f"mmdebstrap --mode={mode}",
        on_line=on_line,
    )
    for leftover in ("lock", "partial"):  # apt's own, copied out with the packages
        safe_rmtree(cache / leftover)


def _pem_bodies(text: str) -> list[str]:
    return ["".join(m.group(1).split()) for m in _PEM_RE.finditer(text)]


def install_ca_bundle(tree: Path, host_bundle: Path = HOST_CA_BUNDLE) -> int:
    """Make the guest trust every CA the host trusts (e.g. a TLS-inspecting proxy's).

    Host certificates missing from the guest's bundle are added as
    ``/usr/local/share/ca-certificates/sandfork-host-N.crt`` and ``update-ca-certificates``
    is run, so they survive later runs of it in the guest. Returns how many were added.
    """
    if not host_bundle.is_file():
        return 0
    guest_bundle = _in_tree(tree, GUEST_CA_BUNDLE)
    known = (
        set(_pem_bodies(guest_bundle.read_text(errors="replace")))
        if guest_bundle.exists()
        else set()
    )
    extra = [
        b
        for b in dict.fromkeys(_pem_bodies(host_bundle.read_text(errors="replace")))
        if b not in known
    ]
    if not extra:
        return 0
    local = _in_tree(tree, "/usr/local/share/ca-certificates")
    local.mkdir(parents=True, exist_ok=True)
    for i, body in enumerate(extra):
        lines = [body[j : j + 64] for j in range(0, len(body), 64)]
        pem = "-----BEGIN CERTIFICATE-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE-----\n"
        (local / f"sandfork-host-{i}.crt").write_text(pem)
    run_in_chroot(tree, ["update-ca-certificates"], what="update-ca-certificates")
    now = set(_pem_bodies(guest_bundle.read_text(errors="replace")))
    if any(b not in now for b in extra):
        # update-ca-certificates skipped some (e.g. a malformed file): use the host bundle.
        shutil.copyfile(host_bundle, guest_bundle)
    return len(extra)


def write_pip_conf(tree: Path, text: str) -> None:
    """Write the guest's ``/etc/pip.conf``."""
    _in_tree(tree, "/etc/pip.conf").write_text(text)


def create_venv(tree: Path) -> None:
    """Create ``/opt/venv`` with the guest's python3 (pip from ensurepip)."""
    run_in_chroot(tree, ["python3", "-m", "venv", VENV], what="creating /opt/venv")


def install_wheels(
    tree: Path, wheels: Path, requirements: Sequence[str], on_line: OnLine = None
) -> None:
    """Install ``requirements`` into ``/opt/venv`` offline, from the wheels in ``wheels``.

    The wheels are copied into the tree's ``/tmp`` for the install and removed afterwards.
    Afterwards every ``certifi`` bundle in the venv is replaced with a link to the system
    bundle, so ``requests`` trusts the same CAs as the rest of the guest.
    """
    if requirements:
        staged = _in_tree(tree, "/tmp/sandfork-wheels")
        safe_rmtree(staged)
        shutil.copytree(wheels, staged)
        try:
            run_in_chroot(
                tree,
                [
                    f"{VENV}/bin/pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-cache-dir",
                    "--no-index",
                    "--find-links",
                    "/tmp/sandfork-wheels",
                    *requirements,
                ],
                what="pip install",
                on_line=on_line,
            )
        finally:
            safe_rmtree(staged)
    for pem in _in_tree(tree, VENV).glob("lib/python3*/site-packages/**/certifi/cacert.pem"):
        pem.unlink()
        pem.symlink_to(GUEST_CA_BUNDLE)


def write_files(tree: Path, files: Mapping[str, str]) -> None:
    """Write the spec's ``[files]`` (through the chroot, so guest symlinks resolve inside)."""
    for path, content in sorted(files.items()):
        run_in_chroot(
            tree,
            ["/bin/sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path],
            what=f"writing {path}",
            input=content,
        )


def run_setup(tree: Path, commands: Sequence[str], on_line: OnLine = None) -> None:
    """Run the spec's ``setup`` commands in the chroot with ``/bin/sh -c``, in order."""
    for i, cmd in enumerate(commands, 1):
        run_in_chroot(
            tree,
            ["/bin/sh", "-c", cmd],
            what=f"setup command {i}/{len(commands)} ({cmd})",
            on_line=on_line,
        )


def finalize_tree(tree: Path) -> None:
    """Guest identity and network files; drop apt's lists and caches and ``/tmp``."""
    run_in_chroot(tree, ["apt-get", "clean"], what="apt-get clean")
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "tmp/*", "var/tmp/*"):
        for p in tree.glob(pattern):
            if p.name != "lock" and p.name != "partial":
                safe_rmtree(p)
    _in_tree(tree, "/etc/hostname").write_text("sandbox\n")
    _in_tree(tree, "/etc/hosts").write_text(
        "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    )
    resolv = _in_tree(tree, "/etc/resolv.conf")
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("nameserver 10.0.2.3\n")


def tree_size(tree: Path) -> int:
    """Bytes allocated by the files of ``tree`` (not following symlinks or mounts)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in filenames + dirnames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def make_image(tree: Path, qcow2: Path, size_mb: int, on_line: OnLine = None) -> dict[str, int]:
    """Turn ``tree`` into an ext4 filesystem of ``size_mb`` MiB (``mke2fs -d``, no loop
    mounts) and convert it to the sparse qcow2 ``qcow2``. Returns sizes in bytes."""
    used = tree_size(tree)
    # ext4 metadata (inode tables, journal) takes about 7 % on top of the data; keep room.
    needed_mb = int(used * 1.15 / 2**20) + 64
    if needed_mb > size_mb:
        suggestion = (needed_mb + 255) // 256 * 256
        raise TemplateError(
            f"disk_size_mb = {size_mb} is too small: the files take {used / 2**20:.0f} MiB;"
            f" use at least {suggestion}"
        )
    raw = qcow2.with_suffix(".ext4")
    try:
        run(
            [
                "mke2fs",
                "-q",
                "-F",
                "-t",
                "ext4",
                "-d",
                str(tree),
                "-L",
                FS_LABEL,
                "-m",
                "0",
                # Initialise inode tables and journal now, so the guest kernel's lazy init
                # does not write to every sandbox's disk overlay.
                # root_owner: / is root's also when mke2fs runs in a user namespace.
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0",
                str(raw),
                f"{size_mb}M",
            ],
            what="mke2fs",
            on_line=on_line,
        )
        run(["e2fsck", "-fn", str(raw)], what="e2fsck (checking the new filesystem)")
        run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(qcow2)], what="qemu-img convert")
    finally:
        raw.unlink(missing_ok=True)
    qcow2.chmod(0o444)  # a base image: sandboxes write to their own overlays
    return {
        "tree_bytes": used,
        "filesystem_bytes": size_mb * 2**20,
        "qcow2_bytes": qcow2.stat().st_size,
    }
