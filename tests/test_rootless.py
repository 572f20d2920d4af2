"""Sandfork as an ordinary user: the built wheel in the user's own virtualenv, a template
built with an empty cache (``mmdebstrap --mode=unshare`` and a user namespace), an engine,
the two-turn flow and a proxy-kernel cell, all as that user; and clear one-line failures.

Runs as root (it creates the user, with ``/etc/subuid`` and ``/etc/subgid`` entries, and
removes it afterwards); the user's processes are ended by their ids.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from sandfork.sdk import Client, Sandbox
from sandfork.templates import BuiltTemplate
from turns import TURN2_FINDS
from unprivileged import UnprivilegedUser, install_wheel, new_user
from vm_guard import guarded_path

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creating a user needs root")

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
USER = "sandfork-rootless"
# An ordinary user's PATH: no sbin folders (QEMU through the session's vm guard).
BASE_PATH = guarded_path("/usr/local/bin:/usr/bin:/bin")

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


class User(UnprivilegedUser):
    """An ordinary user made for this test: its home, and commands run as it."""

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean login-like environment (no variable of the test process), ``extra`` on top."""
        return self.login_env(PATH=BASE_PATH, LANG="C.UTF-8") | dict(extra or {})

    def run(
        self, *args: str, timeout: float = 900, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` as the user in its home (``env`` added); the finished process."""
        return self.call(args, self.env(env), cwd=self.home, timeout=timeout)

    def check(self, *args: str, timeout: float = 900, env: Mapping[str, str] | None = None) -> str:
        """Run ``args`` as the user; its stdout (the test fails if it fails)."""
        return self.output(args, self.env(env), cwd=self.home, timeout=timeout)

    def give(self, source: Path) -> Path:
        """A copy of ``source`` in the user's home, owned by the user."""
        target = self.home / source.name
        shutil.copyfile(source, target)
        os.chown(target, self.uid, self.gid)
        return target


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    """A new ordinary user with subordinate ids and an empty home (removed afterwards)."""
    with new_user(USER) as made:
        yield User(made.name, made.uid, made.gid, made.home)


@pytest.fixture(scope="module")
def installed(user: User) -> User:
    """The wheel built from this checkout, installed into the user's own virtualenv."""
    install_wheel(user, REPO, user.venv, user.env())
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
    strays = [p for p in (built.home / ".cache").rglob("*") if p.lstat().st_uid != built.uid]
    assert strays == [], f"files not owned by the user: {strays[:5]}"


@pytest.fixture(scope="module")
def engine_url(built: User) -> Iterator[tuple[str, str]]:
    """``sandfork serve`` as the user (its own state folder); stopped by its id."""
    with _serving(built, "state") as found:
        yield found


@contextlib.contextmanager
def _serving(
    built: User, name: str, env: Mapping[str, str] | None = None
) -> Iterator[tuple[str, str]]:
    """An engine run by the user, its state in ``~/name``: its URL and API key."""
    state = built.home / name
    log = built.home / f"{name}.log"
    proc = built.start(
        [str(built.venv / "bin" / "sandfork"), "serve", "--port", "0", "--state-dir", str(state)],
        built.env(env),
        cwd=built.home,
        output=log,
    )
    info = state / "run" / "engine.json"
    deadline = time.monotonic() + 60
    while not info.exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    engine = json.loads(info.read_text())
    key = (state / "run" / "api_key").read_text().strip()
    try:
        yield engine["url"], key
    finally:
        os.kill(engine["pid"], signal.SIGTERM)
        proc.wait(60)
        ram = Path(f"/dev/shm/sandfork-{built.uid}")  # the engine's default RAM folder
        ram_files = [p for p in ram.rglob("*") if p.is_file()]
        shutil.rmtree(ram, ignore_errors=True)
        assert ram_files == [], f"RAM files left behind: {ram_files}"
        assert not built.processes(b"qemu-system")


@pytest.mark.vm
def test_two_turns_and_a_kernel_cell_as_the_user(built: User, engine_url: tuple[str, str]) -> None:
    url, key = engine_url
    api = {"SANDFORK_API": url, "SANDFORK_API_KEY": key}
    python = str(built.venv / "bin" / "python")
    turns = str(built.give(TESTS / "turns.py"))
    snapshot_id = built.check(python, turns, "turn1", env=api).strip().splitlines()[-1]
    assert snapshot_id.startswith("snap_")
    found = json.loads(
        built.check(python, turns, "turn2", snapshot_id, env=api).strip().splitlines()[-1]
    )
    assert found == TURN2_FINDS
    cell = built.home / "cell.py"
    cell.write_text(KERNEL_CELL)
    assert built.check(python, str(cell), env=api).strip().splitlines()[-1] == "42 0"


@pytest.mark.vm
def test_a_template_exported_by_root_runs_for_the_user(installed: User, template: None) -> None:
    exported = installed.home / "code-interpreter.sandfork-template"
    export = [sys.executable, "-m", "sandfork", "template", "export", "code-interpreter"]
    subprocess.run([*export, str(exported)], check=True, capture_output=True)  # root's build
    os.chown(exported, installed.uid, installed.gid)
    cache = {"SANDFORK_CACHE_DIR": str(installed.home / "imported-cache")}
    sandfork = str(installed.venv / "bin" / "sandfork")
    installed.check(sandfork, "template", "import", str(exported), env=cache)
    with _serving(installed, "imported-state", cache) as (url, key):
        sandbox = Sandbox.create("code-interpreter", client=Client(url, key))
        try:
            assert sandbox.create_code_context().run_code("6 * 7").text == "42"
        finally:
            sandbox.kill()


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
    doctor = installed.run(sandfork, "doctor", env={"PATH": str(fake_bin)})
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr
    qemu = [line for line in doctor.stdout.splitlines() if "qemu-system-x86_64" in line]
    assert len(qemu) == 1 and "apt-get install qemu-system-x86" in qemu[0], doctor.stdout
    build = installed.run(
        sandfork,
        "template",
        "build",
        "code-interpreter",
        env={"PATH": str(fake_bin), "SANDFORK_CACHE_DIR": str(installed.home / "other-cache")},
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
            env={"SANDFORK_CACHE_DIR": str(installed.home / "other-cache")},
        )
        doctor = installed.run(sandfork, "doctor")
    finally:
        Path("/etc/subuid").write_text(subuid)
    assert build.returncode == 1 and "Traceback" not in build.stderr
    first = build.stderr.strip().splitlines()[0]
    assert first.startswith("sandfork: error: cannot build templates here: /etc/subuid has no")
    assert f"usermod --add-subuids 100000-165535 {installed.name}" in first
    assert doctor.returncode == 1 and "/etc/subuid has no subordinate uids" in doctor.stdout
