"""Sandfork as an ordinary user: the built wheel in the user's own virtualenv, a template
built with an empty cache (``mmdebstrap --mode=unshare`` and a user namespace), an engine,
the two-turn flow and a proxy-kernel cell, all as that user; and clear one-line failures.

Runs as root (it creates the user, with ``/etc/subuid`` and ``/etc/subgid`` entries, and
removes it afterwards); the user's processes are ended by their ids.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandfork.templates import BuiltTemplate

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(os.geteuid() != 0, reason="creating a user needs root"),
]

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
USER = "sandfork-rootless"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"  # an ordinary user's PATH: no sbin folders

KERNEL_CELL = """\
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="sandfork", startup_timeout=300)
out = []
try:
    kc.execute_interactive("import os; print(6 * 7, os.getuid())", timeout=120,
                           output_hook=lambda m: out.append(m["content"].get("text", "")))
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=False)
print("".join(out).strip())
"""


@dataclass
class User:
    """An ordinary user made for this test: its home, and commands run as it."""

    name: str
    home: Path

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    def env(self, **extra: str) -> dict[str, str]:
        """A clean login-like environment (no variable of the test process)."""
        return {
            "HOME": str(self.home),
            "USER": self.name,
            "PATH": BASE_PATH,
            "LANG": "C.UTF-8",
            **extra,
        }

    def argv(self, args: list[str], env: dict[str, str]) -> list[str]:
        pairs = [f"{k}={v}" for k, v in env.items()]
        return ["runuser", "-u", self.name, "--", "env", "-i", *pairs, *args]

    def run(
        self, *args: str, timeout: float = 900, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` as the user in its home; the finished process."""
        return subprocess.run(
            self.argv(list(args), self.env(**extra)),
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def check(self, *args: str, timeout: float = 900, **extra: str) -> str:
        """Run ``args`` as the user; its stdout (the test fails if it fails)."""
        done = self.run(*args, timeout=timeout, **extra)
        assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def give(self, source: Path) -> Path:
        """A copy of ``source`` in the user's home, owned by the user."""
        target = self.home / source.name
        shutil.copyfile(source, target)
        os.chown(target, *self.ids)
        return target

    @property
    def ids(self) -> tuple[int, int]:
        entry = pwd.getpwnam(self.name)
        return entry.pw_uid, entry.pw_gid


def _has_subids(name: str, kind: str) -> bool:
    lines = (
        Path(f"/etc/sub{kind}").read_text().splitlines() if Path(f"/etc/sub{kind}").exists() else []
    )
    return any(line.split(":")[0] == name for line in lines)


def _remove_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    """A new ordinary user with subordinate ids and an empty home (removed afterwards)."""
    _remove_user(USER)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
    for kind, flag in (("uid", "--add-subuids"), ("gid", "--add-subgids")):
        if not _has_subids(USER, kind):  # useradd adds them where SUB_*_COUNT is set
            subprocess.run(["usermod", flag, "300000-365535", USER], check=True)
    yield User(USER, Path(pwd.getpwnam(USER).pw_dir))
    _remove_user(USER)


@pytest.fixture(scope="module")
def installed(user: User, tmp_path_factory: pytest.TempPathFactory) -> User:
    """The wheel built from this checkout, installed into the user's own virtualenv."""
    out = tmp_path_factory.mktemp("wheel")
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
        env=env,
        cwd=REPO,
    )
    (wheel,) = out.glob("sandfork-*.whl")
    given = user.give(wheel)
    user.check("/usr/bin/python3", "-m", "venv", str(user.venv))
    user.check(str(user.venv / "bin" / "pip"), "install", "-q", str(given), timeout=600)
    return user


@pytest.fixture(scope="module")
def built(installed: User) -> User:
    """The default template, built as the user from an empty cache."""
    assert not (installed.home / ".cache" / "sandfork").exists()
    started = time.monotonic()
    installed.check(
        str(installed.venv / "bin" / "sandfork"), "template", "build", "code-interpreter"
    )
    print(f"rootless cold template build: {time.monotonic() - started:.0f} s")
    return installed


def test_build_as_user_gives_the_same_key_and_owns_its_cache(built: User) -> None:
    probe = "from sandfork.templates import BuiltTemplate as B; t = B.find('code-interpreter'); print(t.key, t.rootfs)"  # noqa: E501
    key, rootfs = built.check(str(built.venv / "bin" / "python"), "-c", probe).split()
    ours = BuiltTemplate.find("code-interpreter")
    assert ours is not None and key == ours.key  # built as root by the session's fixture
    assert rootfs.startswith(f"{built.home}/.cache/sandfork/")
    manifest = json.loads((Path(rootfs).parent / "manifest.json").read_text())
    assert manifest["built_with"] == "mmdebstrap --mode=unshare"
    uid, _ = built.ids
    strays = [p for p in (built.home / ".cache").rglob("*") if p.lstat().st_uid != uid]
    assert strays == [], f"files not owned by the user: {strays[:5]}"


@pytest.fixture(scope="module")
def engine_url(built: User) -> Iterator[tuple[str, str]]:
    """``sandfork serve`` as the user (its own state folder); stopped by its id."""
    state = built.home / "state"
    log = (built.home / "engine.log").open("wb")
    argv = built.argv(
        [str(built.venv / "bin" / "sandfork"), "serve", "--port", "0", "--state-dir", str(state)],
        built.env(),
    )
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=built.home)
    info = state / "run" / "engine.json"
    deadline = time.monotonic() + 60
    while not info.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (
            built.home / "engine.log"
        ).read_text()
        time.sleep(0.1)
    engine = json.loads(info.read_text())
    key = (state / "run" / "api_key").read_text().strip()
    try:
        yield engine["url"], key
    finally:
        os.kill(engine["pid"], signal.SIGTERM)
        proc.wait(60)
        ram = Path(f"/dev/shm/sandfork-{built.ids[0]}")  # the engine's default RAM folder
        ram_files = [p for p in ram.rglob("*") if p.is_file()]
        shutil.rmtree(ram, ignore_errors=True)
        assert ram_files == [], f"RAM files left behind: {ram_files}"
        assert not [
            p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_users_qemu(p, built)
        ]


def _is_users_qemu(proc: Path, user: User) -> bool:
    try:
        return (
            proc.stat().st_uid == user.ids[0] and b"qemu-system" in (proc / "cmdline").read_bytes()
        )
    except OSError:
        return False


def test_two_turns_and_a_kernel_cell_as_the_user(built: User, engine_url: tuple[str, str]) -> None:
    url, key = engine_url
    api = {"SANDFORK_API": url, "SANDFORK_API_KEY": key}
    python = str(built.venv / "bin" / "python")
    turns = str(built.give(TESTS / "turns.py"))
    snapshot_id = built.check(python, turns, "turn1", **api).strip().splitlines()[-1]
    assert snapshot_id.startswith("snap_")
    found = json.loads(
        built.check(python, turns, "turn2", snapshot_id, **api).strip().splitlines()[-1]
    )
    assert found == {
        "rows": "100000",
        "stdout": "24999.75\n",
        "error": None,
        "kernel_tabulate": "'0.9.0'",
        "exec_tabulate": "0.9.0",
    }
    cell = built.home / "cell.py"
    cell.write_text(KERNEL_CELL)
    assert built.check(python, str(cell), **api).strip().splitlines()[-1] == "42 0"


def _bin_without_qemu(where: Path) -> Path:
    """A folder with every host program but QEMU's, to stand for ``PATH``."""
    where.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/usr/local/sbin", "/usr/sbin"):
        for program in Path(folder).iterdir():
            if not program.name.startswith("qemu") and not (where / program.name).exists():
                (where / program.name).symlink_to(program)
    where.chmod(0o755)
    return where


def test_missing_qemu_is_one_clear_line(installed: User) -> None:
    fake_bin = _bin_without_qemu(installed.home / "bin-without-qemu")
    sandfork = str(installed.venv / "bin" / "sandfork")
    doctor = installed.run(sandfork, "doctor", PATH=str(fake_bin))
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr
    qemu = [line for line in doctor.stdout.splitlines() if "qemu-system-x86_64" in line]
    assert len(qemu) == 1 and "apt-get install qemu-system-x86" in qemu[0], doctor.stdout
    build = installed.run(
        sandfork,
        "template",
        "build",
        "code-interpreter",
        PATH=str(fake_bin),
        SANDFORK_CACHE_DIR=str(installed.home / "other-cache"),
    )
    assert build.returncode == 1 and "Traceback" not in build.stderr
    first, hint = build.stderr.strip().splitlines()
    assert first.startswith("sandfork: error: cannot build templates here: qemu-img not installed")
    assert "apt-get install qemu-utils" in first and hint.startswith("hint: ")


def test_missing_subordinate_ids_are_one_clear_line(installed: User) -> None:
    sandfork = str(installed.venv / "bin" / "sandfork")
    subuid = Path("/etc/subuid").read_text()
    try:
        lines = [line for line in subuid.splitlines() if line.split(":")[0] != installed.name]
        Path("/etc/subuid").write_text("".join(f"{line}\n" for line in lines))
        build = installed.run(
            sandfork,
            "template",
            "build",
            "code-interpreter",
            SANDFORK_CACHE_DIR=str(installed.home / "other-cache"),
        )
        doctor = installed.run(sandfork, "doctor")
    finally:
        Path("/etc/subuid").write_text(subuid)
    assert build.returncode == 1 and "Traceback" not in build.stderr
    first = build.stderr.strip().splitlines()[0]
    assert first.startswith("sandfork: error: cannot build templates here: /etc/subuid has no")
    assert f"usermod --add-subuids 100000-165535 {installed.name}" in first
    assert doctor.returncode == 1 and "/etc/subuid has no subordinate uids" in doctor.stdout
