"""Template builder: specs, cache keys, apt sources, initramfs, interrupted builds.

Real behaviour throughout: the kernel and busybox packages are downloaded with apt (into a
per-session cache), the failing-build test runs a real debootstrap (about a minute, root).
A full ``code-interpreter`` build and boot is exercised by the engine's tests.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfork.protocol import MIN_MEMORY_MB
from sandfork.templates import (
    BuiltTemplate,
    TemplateError,
    TemplateSpec,
    builder,
    ensure_template,
    list_specs,
    load_spec,
    parse_spec,
)
from sandfork.templates.builder import ensure_boot, rootfs_inputs
from sandfork.templates.cache import TMP_PREFIX, build_lock, hash_key, read_manifest
from sandfork.templates.chroot import mounts_under, safe_rmtree
from sandfork.templates.cpio import CpioWriter, read_cpio
from sandfork.templates.debian import (
    apt_mirror,
    parse_deb822_sources,
    parse_one_line_sources,
)
from sandfork.templates.initramfs import agent_files, files_hash
from sandfork.templates.kernel import MODULES, parse_modules_dep, unpack_kernel
from sandfork.templates.proc import run
from sandfork.templates.pvh import has_pvh_note
from sandfork.templates.wheels import guest_pip_conf, parse_pip_config_list

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap and chroot need root")


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for the session, so the kernel .deb is downloaded once."""
    return tmp_path_factory.mktemp("sandfork-cache")


@pytest.fixture
def cache(session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SANDFORK_CACHE_DIR", str(session_cache))
    return session_cache


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# --- specs ---------------------------------------------------------------------------------


def test_builtin_code_interpreter_spec() -> None:
    spec = load_spec("code-interpreter")
    assert spec.name == "code-interpreter"
    assert spec.base == "debian:bookworm"
    for pkg in ("ipykernel", "numpy", "pandas", "matplotlib", "requests"):
        assert pkg in spec.pip
    assert (spec.memory_mb, spec.cpu, spec.disk_size_mb) == (1024, 2, 4096)
    assert spec.source is not None and spec.source.name == "code-interpreter.toml"
    assert "code-interpreter" in [s.name for s in list_specs()]


def test_spec_defaults_and_name_from_file(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path / "tiny.toml", 'apt = ["git"]\n'))
    assert spec == TemplateSpec(name="tiny", apt=("git",))
    assert (spec.disk_size_mb, spec.memory_mb, spec.cpu) == (4096, 1024, 2)


def test_cpus_is_read_as_cpu(tmp_path: Path) -> None:
    """``cpus``, the field's earlier name, still reads: specs written before keep working."""
    assert load_spec(write(tmp_path / "older.toml", "cpus = 4\n")).cpu == 4
    assert load_spec(write(tmp_path / "newer.toml", "cpu = 3\n")).cpu == 3


def test_user_templates_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORK_TEMPLATES_DIR", str(tmp_path))
    write(tmp_path / "mine.toml", 'name = "mine"\ndescription = "x"\n')
    write(tmp_path / "broken.toml", "cpus = 'two'\n")
    names = [s.name for s in list_specs()]
    assert "mine" in names and "code-interpreter" in names and "broken" not in names
    assert load_spec("mine").description == "x"
    with pytest.raises(TemplateError, match=r"broken\.toml: field 'cpus'"):
        list_specs(strict=True)
    with pytest.raises(TemplateError, match=r"unknown template 'nope'.*mine"):
        load_spec("nope")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            'base = "ubuntu:noble"',
            r"field 'base': unsupported base 'ubuntu:noble'.*debian:bookworm",
        ),
        ('colour = "blue"', r"unknown field 'colour' \(known fields: name, description"),
        ('apt = "git"', r"field 'apt': expected a list of strings, got a string"),
        ("apt = [1]", r"field 'apt\[0\]': expected a string, got an integer"),
        ('apt = ["Not A Package"]', r"field 'apt\[0\]': not a Debian package name"),
        ('pip = ["--index-url=http://x"]', r"field 'pip\[0\]': pip options are not allowed"),
        ('disk_size_mb = "4G"', r"field 'disk_size_mb': expected an integer, got a string"),
        ("cpu = true", r"field 'cpu': expected an integer, got a boolean"),
        ("cpus = true", r"field 'cpus': expected an integer, got a boolean"),
        ("cpu = 2\ncpus = 2", r"field 'cpus': give 'cpu' only \('cpus' is its earlier name\)"),
        ("memory_mb = 64", rf"field 'memory_mb': must be between {MIN_MEMORY_MB} and"),
        ('setup = "make"', r"field 'setup': expected a list of strings"),
        ('files = ["a"]', r"field 'files': expected a table of path = content, got a list"),
        ('[files]\n"etc/x" = "y"', r"field 'files.'etc/x'': must be an absolute path"),
        ('[files]\n"/etc/../x" = "y"', r"field 'files.'/etc/../x'': must be a normalized path"),
        ('[files]\n"/etc/x" = 3', r"field 'files.'/etc/x'': expected the file content as a string"),
        ('name = "Bad Name"', r"field 'name': 'Bad Name' is not a valid template name"),
        ("name = [", r"invalid TOML"),
    ],
)
def test_spec_validation_errors(tmp_path: Path, toml: str, message: str) -> None:
    path = write(tmp_path / "t.toml", toml + "\n")
    with pytest.raises(TemplateError, match=message) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: ")


def test_spec_file_name_must_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORK_TEMPLATES_DIR", str(tmp_path))
    write(tmp_path / "a.toml", 'name = "b"\n')
    with pytest.raises(TemplateError, match=r"a\.toml: field 'name': 'b' does not match"):
        load_spec("a")


# --- cache keys ----------------------------------------------------------------------------


BASE_SPEC = """
name = "k"
description = "one"
apt = ["git", "curl"]
pip = ["numpy", "pandas"]
setup = ["echo 1", "echo 2"]
memory_mb = 1024
[files]
"/a" = "A"
"/b" = "B"
"""


def rootfs_key(text: str) -> str:
    return hash_key(rootfs_inputs(parse_spec(textwrap.dedent(text))))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('description = "one"', 'description = "two"'),
        ("memory_mb = 1024", "memory_mb = 4096\ncpu = 8"),
        ('apt = ["git", "curl"]', 'apt = ["curl", "git", "git"]'),
        ('"/a" = "A"\n"/b" = "B"', '"/b" = "B"\n"/a" = "A"'),
    ],
)
def test_rootfs_key_ignores_non_inputs(old: str, new: str) -> None:
    assert old in BASE_SPEC
    assert rootfs_key(BASE_SPEC) == rootfs_key(BASE_SPEC.replace(old, new))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('apt = ["git", "curl"]', 'apt = ["git"]'),
        ('pip = ["numpy", "pandas"]', 'pip = ["numpy"]'),
        ('pip = ["numpy", "pandas"]', 'pip = ["pandas", "numpy"]'),
        ('setup = ["echo 1", "echo 2"]', 'setup = ["echo 2", "echo 1"]'),
        ('"/a" = "A"', '"/a" = "a"'),
        ("memory_mb = 1024", "memory_mb = 1024\ndisk_size_mb = 8192"),
    ],
)
def test_rootfs_key_follows_inputs(old: str, new: str) -> None:
    assert old in BASE_SPEC
    assert rootfs_key(BASE_SPEC) != rootfs_key(BASE_SPEC.replace(old, new))


def test_rootfs_key_follows_mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORK_APT_MIRROR", "http://mirror-one.invalid/debian")
    one = rootfs_key(BASE_SPEC)
    assert one == rootfs_key(BASE_SPEC)
    monkeypatch.setenv("SANDFORK_APT_MIRROR", "http://mirror-two.invalid/debian")
    assert rootfs_key(BASE_SPEC) != one


def test_source_files_hash(tmp_path: Path) -> None:
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "server.py", "x = 1\n")
    write(tmp_path / "pkg" / "__pycache__" / "server.cpython-311.pyc", "junk")
    files = agent_files(tmp_path / "pkg")
    assert [f.as_posix() for f in files] == ["__init__.py", "server.py"]

    def h() -> str:
        return files_hash(
            (f.as_posix(), tmp_path / "pkg" / f) for f in agent_files(tmp_path / "pkg")
        )

    before = h()
    assert h() == before
    (tmp_path / "pkg" / "server.py").write_text("x = 2\n")
    assert h() != before


# --- apt sources ---------------------------------------------------------------------------


DEB822 = """\
# the archive
Types: deb deb-src
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://archive.example/debian/
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBGPL0BUBEADmW5NdOOHwPIJlgPu6JDcKw/NZJPR8lsD3K87ZM18gzyQZJD+w
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb
URIs: http://archive.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_parse_deb822_sources() -> None:
    entries = parse_deb822_sources(DEB822)
    assert [(e.type, e.suite) for e in entries] == [
        ("deb", "bookworm"),
        ("deb", "bookworm-updates"),
        ("deb-src", "bookworm"),
        ("deb-src", "bookworm-updates"),
        ("deb", "bookworm-security"),
    ]
    assert entries[0].uri == "http://archive.example/debian/"
    assert entries[0].components == ("main", "contrib")


def test_parse_one_line_sources() -> None:
    text = """\
    # comment
    deb-src http://src.example/debian bookworm main
    deb [arch=amd64 signed-by=/k.gpg] https://one.example/debian bookworm main non-free  # x
    deb cdrom:[Debian GNU/Linux 12]/ bookworm main
    """
    entries = parse_one_line_sources(textwrap.dedent(text))
    assert [(e.type, e.uri, e.suite) for e in entries][:2] == [
        ("deb-src", "http://src.example/debian", "bookworm"),
        ("deb", "https://one.example/debian", "bookworm"),
    ]
    assert entries[1].components == ("main", "non-free")


def test_apt_mirror_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDFORK_APT_MIRROR", raising=False)
    etc = tmp_path / "apt"
    write(etc / "sources.list.d" / "vendor.list", "deb https://vendor.example/apt cloud-sdk main\n")
    write(
        etc / "sources.list.d" / "off.sources",
        "Enabled: no\nTypes: deb\nURIs: http://off.example/debian\n"
        "Suites: bookworm\nComponents: main\n",
    )
    write(
        etc / "sources.list.d" / "old.list.disabled",
        "deb http://disabled.example/debian bookworm main\n",
    )
    write(etc / "sources.list.d" / "z-debian.sources", DEB822)
    assert apt_mirror("bookworm", etc) == "http://archive.example/debian"
    # the one-line sources.list is read first
    write(etc / "sources.list", "deb http://first.example/debian bookworm main\n")
    assert apt_mirror("bookworm", etc) == "http://first.example/debian"
    # another suite: fall back to a plain release entry, never the security archive
    assert apt_mirror("trixie", etc) == "http://first.example/debian"
    monkeypatch.setenv("SANDFORK_APT_MIRROR", "http://override.example/debian/")
    assert apt_mirror("bookworm", etc) == "http://override.example/debian"


def test_apt_mirror_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDFORK_APT_MIRROR", raising=False)
    write(tmp_path / "sources.list", "deb http://x.example/debian bookworm contrib\n")
    with pytest.raises(TemplateError, match="no Debian archive with the 'main' component"):
        apt_mirror("bookworm", tmp_path)


def test_apt_mirror_of_this_machine() -> None:
    mirror = apt_mirror("bookworm")
    assert mirror.startswith(("http://", "https://", "file://"))


# --- pip configuration ---------------------------------------------------------------------


def test_pip_config_for_guest() -> None:
    listing = textwrap.dedent(
        """\
        :env:.cert='/etc/ssl/certs/ca-certificates.crt'
        :env:.index-url='https://env.example/simple'
        global.index-url='https://global.example/simple'
        global.extra-index-url='file:///opt/pypi/simple https://extra.example/simple'
        user.extra-index-url='https://user.example/simple'
        """
    )
    index = parse_pip_config_list(listing)
    assert index == {
        "index-url": ["https://env.example/simple"],
        "extra-index-url": ["https://user.example/simple", "https://extra.example/simple"],
    }
    conf = guest_pip_conf(index)
    assert "cert = /etc/ssl/certs/ca-certificates.crt" in conf
    assert "index-url = https://env.example/simple" in conf
    assert "file://" not in conf
    assert parse_pip_config_list("global.extra-index-url='file:///opt/pypi/simple'\n") == {}


# --- commands ------------------------------------------------------------------------------


def test_failed_command_message_has_command_and_output_tail() -> None:
    script = "for i in $(seq 1 100); do echo line$i; done; echo oops >&2; exit 7"
    with pytest.raises(TemplateError) as info:
        run(["sh", "-c", script], what="counting")
    msg = str(info.value)
    assert msg.startswith("counting failed: `sh -c ")
    assert "exited with status 7" in msg
    assert "line100" in msg and "oops" in msg
    assert "\nline62\n" in msg and "\nline61\n" not in msg  # the last 40 lines only


# --- cpio and initramfs --------------------------------------------------------------------


def test_cpio_is_readable_by_cpio(tmp_path: Path) -> None:
    out = tmp_path / "a.cpio"
    with open(out, "wb") as f:
        w = CpioWriter(f)
        w.file("init", b"#!/bin/sh\n", 0o755)
        w.file("deep/dir/file.txt", b"x" * 5)
        w.symlink("bin/sh", "busybox")
        w.char_device("dev/console", 5, 1)
        w.close()
    listing = run(["cpio", "-it", "--quiet"], input=out.read_bytes()).stdout.split()
    assert listing == [
        "init",
        "deep",
        "deep/dir",
        "deep/dir/file.txt",
        "bin",
        "bin/sh",
        "dev",
        "dev/console",
    ]
    entries = {e.path: e for e in read_cpio(out.read_bytes())}
    assert entries["deep/dir/file.txt"].data == b"xxxxx"
    assert stat.S_ISCHR(entries["dev/console"].mode) and entries["dev/console"].rdev == (5, 1)


@pytest.fixture(scope="session")
def boot_dir(session_cache: Path) -> Path:
    old = os.environ.get("SANDFORK_CACHE_DIR")
    os.environ["SANDFORK_CACHE_DIR"] = str(session_cache)
    try:
        return ensure_boot()
    finally:
        if old is None:
            del os.environ["SANDFORK_CACHE_DIR"]
        else:
            os.environ["SANDFORK_CACHE_DIR"] = old


def test_initramfs_contents(boot_dir: Path, session_cache: Path, tmp_path: Path) -> None:
    manifest = read_manifest(boot_dir)
    assert manifest is not None and manifest["kind"] == "boot"
    entries = read_cpio(gzip.decompress((boot_dir / "initrd.img").read_bytes()))
    by_path = {e.path: e for e in entries}
    order = [e.path for e in entries]

    for path in ("init", "bin/busybox", "sandfork/init"):
        assert stat.S_ISREG(by_path[path].mode) and by_path[path].mode & 0o111, path
    assert by_path["init"].data.startswith(b"#!/bin/busybox sh\n")
    assert b"switch_root /newroot /run/sandfork/init" in by_path["init"].data
    assert b"exec /usr/bin/env -i" in by_path["sandfork/init"].data
    assert stat.S_ISCHR(by_path["dev/console"].mode)

    # modules: all wanted ones, each after everything it depends on (per modules.dep)
    names = by_path["etc/sandfork/modules"].data.decode().split()
    assert names == manifest["modules"]
    assert set(MODULES) <= set(names)
    assert {"virtio_ring", "virtio", "failover", "net_failover"} <= set(names)
    assert [p for p in order if p.startswith("lib/modules/")] == [
        f"lib/modules/{n}.ko" for n in names
    ]
    kernel_deb = next((session_cache / "debs").glob("linux-image-*.deb"))
    unpacked = unpack_kernel(kernel_deb, tmp_path / "k")
    deps = parse_modules_dep((unpacked.modules_dir / "modules.dep").read_text())
    for i, name in enumerate(names):
        for dep in deps[name][1]:
            assert names.index(dep) < i, f"{dep} must be loaded before {name}"
        assert by_path[f"lib/modules/{name}.ko"].data[:4] == b"\x7fELF"

    # the agent package, renamed
    agent = {p.as_posix() for p in agent_files()}
    shipped = {
        p.removeprefix("sandfork/agent/sandfork_agent/")
        for p in order
        if p.startswith("sandfork/agent/sandfork_agent/") and stat.S_ISREG(by_path[p].mode)
    }
    assert {p for p in shipped if p.endswith(".py")} == agent
    # ... with unchecked-hash bytecode, so the guest neither compiles nor stats the sources
    tag = sys.implementation.cache_tag
    for rel in agent:
        pyc_name = f"{Path(rel).parent / '__pycache__' / Path(rel).stem}.{tag}.pyc"
        pyc = by_path[f"sandfork/agent/sandfork_agent/{pyc_name.removeprefix('./')}"].data
        assert int.from_bytes(pyc[4:8], "little") == 0b01  # hash-based, unchecked

    # the kernel: PVH ELF preferred, bzImage kept
    assert (boot_dir / "vmlinuz").is_file()
    if manifest["kernel_format"] == "pvh-elf":
        assert has_pvh_note((boot_dir / "vmlinux").read_bytes())


def test_kernel_files_shared_between_boot_artifacts(boot_dir: Path, session_cache: Path) -> None:
    from sandfork.templates.boot import link_kernel_files

    manifest = read_manifest(boot_dir)
    assert manifest is not None
    dest = session_cache / "boot" / f"{TMP_PREFIX}link-test"
    dest.mkdir()
    try:
        assert link_kernel_files(session_cache, manifest["inputs"]["kernel"], dest)
        assert (dest / "vmlinuz").stat().st_ino == (boot_dir / "vmlinuz").stat().st_ino
        other = {"name": manifest["inputs"]["kernel"]["name"], "version": "0-other"}
        assert not link_kernel_files(session_cache, other, dest)
    finally:
        safe_rmtree(dest)


def test_initramfs_scripts_are_valid_sh() -> None:
    from sandfork.templates.initramfs import GUEST_INIT, INITRAMFS_INIT

    for script in (GUEST_INIT, INITRAMFS_INIT):
        run(["sh", "-n", str(script)])
        run(["busybox", "sh", "-n", str(script)])


def test_boot_build_is_cached(boot_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def build_boot(*args: object) -> Path:
        raise AssertionError("a cached boot artifact was built again")

    monkeypatch.setattr(builder, "build_boot", build_boot)
    assert ensure_boot() == boot_dir


# --- locking, interruption -----------------------------------------------------------------


def test_build_lock_waits(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from sandfork.templates.cache import build_lock\n"
            "with build_lock(Path(sys.argv[1])):\n"
            "    print('locked', flush=True)\n"
            "    sys.stdin.readline()\n"
            "    print('released', flush=True)\n",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"

    def release() -> None:  # let the holder go
        assert holder.stdin is not None
        if not holder.stdin.closed:
            holder.stdin.write("go\n")
            holder.stdin.close()

    def on_wait() -> None:  # the lock is busy, as it should be
        waited.append(True)
        release()

    waited: list[bool] = []
    with build_lock(tmp_path, on_wait=on_wait):
        release()  # (a no-op unless the lock did not wait: then the holder must not hang)
        after = holder.stdout.readline().strip()
    holder.wait(30)
    assert waited == [True] and after == "released"  # the lock was had only after that


BOOT_SCRIPT = "from sandfork.templates.builder import ensure_boot; print(ensure_boot())"


def test_concurrent_and_killed_boot_builds(tmp_path: Path) -> None:
    env = {**os.environ, "SANDFORK_CACHE_DIR": str(tmp_path)}
    # SIGKILL a build in the middle: nothing may count as built, leftovers go next time.
    victim = subprocess.Popen([sys.executable, "-c", BOOT_SCRIPT], env=env)
    deadline = time.monotonic() + 300  # a hang, not a speed
    while not list((tmp_path / "boot").glob(f"{TMP_PREFIX}*")):
        assert time.monotonic() < deadline and victim.poll() is None, "build did not start"
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)  # its staging folder is there: it is mid-way
    victim.wait()
    assert [
        p.name for p in (tmp_path / "boot").iterdir() if not p.name.startswith(TMP_PREFIX)
    ] == []

    # two builders at once: one builds, the other waits and finds it built
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BOOT_SCRIPT], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
    built = [p for p in (tmp_path / "boot").iterdir()]
    assert [p.name for p in built] == [Path(outs[0]).name]
    assert read_manifest(built[0]) is not None


@pytest.fixture
def isolated_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, session_cache: Path
) -> Iterator[Path]:
    """A fresh cache that shares the session's downloaded .debs."""
    root = tmp_path / "cache"
    (root / "debs").mkdir(parents=True)
    for deb in (session_cache / "debs").glob("*.deb"):
        os.link(deb, root / "debs" / deb.name)
    monkeypatch.setenv("SANDFORK_CACHE_DIR", str(root))
    yield root
    assert mounts_under(root) == []


@needs_root
def test_failing_setup_leaves_nothing_built(isolated_cache: Path, tmp_path: Path) -> None:
    root = isolated_cache
    # leftovers of an earlier interrupted build, one with a mount inside
    stale = root / "rootfs" / f"{TMP_PREFIX}old-0123456789abcdef-1-aaaaaa"
    (stale / "tree" / "proc").mkdir(parents=True)
    run(["mount", "-t", "tmpfs", "tmpfs", str(stale / "tree" / "proc")])
    incomplete = root / "rootfs" / "fails-0000000000000000"
    incomplete.mkdir(parents=True)
    (incomplete / "rootfs.qcow2").write_bytes(b"")

    spec_path = write(
        tmp_path / "fails.toml",
        """\
        name = "fails"
        apt = ["less"]
        setup = ["echo first ok", "echo about to fail; echo boom-detail >&2; exit 3"]
        [files]
        "/etc/sandfork-test" = "hello"
        """,
    )
    spec = load_spec(spec_path)
    with pytest.raises(TemplateError) as info:
        ensure_template(spec, progress=False)
    msg = str(info.value)
    assert "setup command 2/2" in msg
    assert "echo boom-detail >&2; exit 3" in msg
    assert "exited with status 3" in msg
    assert "about to fail" in msg and "boom-detail" in msg

    assert BuiltTemplate.find(spec) is None
    assert not stale.exists() and not incomplete.exists()
    assert list((root / "rootfs").iterdir()) == []
    assert mounts_under(root) == []
    # the boot artifact was complete before the rootfs failed and stays usable
    boots = list((root / "boot").iterdir())
    assert len(boots) == 1 and read_manifest(boots[0]) is not None
    # debootstrap's downloads are kept for the next attempt
    assert any((root / "debs").glob("less_*.deb"))


@needs_root
def test_sigkilled_rootfs_build_is_cleaned_up(isolated_cache: Path, tmp_path: Path) -> None:
    """A builder killed during debootstrap leaves an orphaned debootstrap writing into its
    temp dir; the next build kills it and removes the dir (and nothing counts as built)."""
    from sandfork.templates.cache import clean_stale
    from sandfork.templates.chroot import processes_using

    root = isolated_cache
    spec_path = write(tmp_path / "killed.toml", 'name = "killed"\n')
    builder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom pathlib import Path\nfrom sandfork.templates import ensure_template\n"
            "ensure_template(Path(sys.argv[1]), progress=False)",
            str(spec_path),
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list((root / "rootfs").glob(f"{TMP_PREFIX}killed-*/tree")):
            assert time.monotonic() < deadline and builder.poll() is None, "no debootstrap"
            time.sleep(0.1)
        while not set(processes_using(root)) - {builder.pid}:  # debootstrap writes the tree
            assert time.monotonic() < deadline and builder.poll() is None, "no debootstrap"
            time.sleep(0.1)
    finally:
        builder.kill()
        builder.wait()
    assert processes_using(root), "expected the orphaned debootstrap to be running"
    assert BuiltTemplate.find(spec_path) is None
    with build_lock(root):
        removed = clean_stale(root)
    assert [p.name.split("-")[1] for p in removed] == ["killed"]
    assert processes_using(root) == []
    assert list((root / "rootfs").iterdir()) == []


def test_safe_rmtree_unmounts_first(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mount needs root")
    tree = tmp_path / "tree"
    (tree / "proc").mkdir(parents=True)
    run(["mount", "-t", "proc", "proc", str(tree / "proc")])
    assert mounts_under(tree) == [tree / "proc"]
    safe_rmtree(tree)
    assert not tree.exists()
    assert Path("/proc/self/status").exists()


def test_manifest_is_written_last(tmp_path: Path) -> None:
    from sandfork.templates.cache import Staging

    final = tmp_path / "boot" / "abc"
    with pytest.raises(RuntimeError):
        with Staging(final) as st:
            (st.path / "vmlinuz").write_text("k")
            raise RuntimeError("interrupted")
    assert not final.exists() and list((tmp_path / "boot").iterdir()) == []
    with Staging(final) as st:
        (st.path / "vmlinuz").write_text("k")
        st.commit({"kind": "boot"})
    data = json.loads((final / "manifest.json").read_text())
    assert data["kind"] == "boot" and "built_at" in data
    assert sorted(p.name for p in (tmp_path / "boot").iterdir()) == ["abc"]
