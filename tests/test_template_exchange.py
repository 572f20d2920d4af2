"""Template export and import: a built template carried as one file to another cache (a
shared folder the engine only reads, checked entry by entry), where an engine runs a sandbox
from it; and crafted files (a tampered member, a wrong size, a path that escapes, a lying key)
refused with nothing written."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard

from conftest import EngineProcess
from sandfork.sdk import Sandbox
from sandfork.templates import BuiltTemplate, TemplateError
from sandfork.templates.exchange import import_template
from sandfork.templates.exchange_schema import MEMBERS

MANIFEST = "manifest.json"


def sandfork(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m sandfork ARGS`` with ``env`` added to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "sandfork", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, template: None) -> Path:
    """The default template (built by the session) exported to a file."""
    out = tmp_path_factory.mktemp("export") / "code-interpreter.sandfork-template"
    done = sandfork("template", "export", "code-interpreter", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture
def shared(exported: Path, tmp_path: Path) -> Path:
    """The exported template imported into a shared folder."""
    folder = tmp_path / "shared"
    done = sandfork("template", "import", str(exported), "--into", str(folder))
    assert done.returncode == 0, done.stderr
    return folder


def tree_state(folder: Path) -> dict[str, tuple[int, ...]]:
    """Everything a write would change of each entry under ``folder`` (its type and mode,
    size, inode, modification and change times; a read changes none of them). Permissions
    cannot show it: the tests run as root, which writes into a folder of mode 0555."""
    state = {}
    for path in [folder, *folder.rglob("*")]:
        st = path.lstat()
        key = (st.st_mode, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        state[str(path.relative_to(folder))] = key
    return state


@pytest.mark.vm
def test_imported_shared_template_runs_a_cell(shared: Path, tmp_path: Path) -> None:
    """An engine with an empty cache of its own finds the template in the shared folder."""
    ours = BuiltTemplate.find("code-interpreter")
    assert ours is not None
    before = tree_state(shared)
    (tmp_path / "home").mkdir()
    engine = EngineProcess(tmp_path / "home")
    engine.env = {
        "SANDFORK_CACHE_DIR": str(tmp_path / "empty-cache"),
        "SANDFORK_TEMPLATE_PATH": str(shared),
    }
    engine.start()
    try:
        sandbox = Sandbox.create("code-interpreter", client=engine.client())
        try:
            result = sandbox.create_code_context().run_code("sum(range(10))")
            assert result.error is None and result.text == "45"
        finally:
            sandbox.kill()
        templates = engine.client().request("GET", "/templates")
    finally:
        engine.close()
    assert "code-interpreter" in json.dumps(templates)
    assert "rootfs.qcow2" in {Path(name).name for name in before}
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "from sandfork.templates import BuiltTemplate as B;"
            "t = B.find('code-interpreter'); print(t.key, t.rootfs)",
        ],
        env={
            **os.environ,
            "SANDFORK_CACHE_DIR": str(tmp_path / "empty-cache"),
            "SANDFORK_TEMPLATE_PATH": str(shared),
        },
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert found == [ours.key, str(shared / "rootfs" / ours.rootfs.parent.name / "rootfs.qcow2")]
    assert tree_state(shared) == before  # the engine never wrote into the shared folder


def test_import_into_another_cache_is_listed(exported: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    first = sandfork("template", "import", str(exported), SANDFORK_CACHE_DIR=cache)
    assert first.returncode == 0, first.stderr
    again = sandfork("template", "import", str(exported), SANDFORK_CACHE_DIR=cache)
    assert again.returncode == 0, again.stderr  # already there: nothing to do
    listed = sandfork(
        "template", "ls", "--json", SANDFORK_CACHE_DIR=cache, SANDFORK_TEMPLATE_PATH=""
    )
    assert {t["name"]: t["built"] for t in json.loads(listed.stdout)}["code-interpreter"]


# --- crafted files ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_manifest(exported: Path) -> dict[str, Any]:
    """The manifest of the exported file (its first member)."""
    with exported.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as z:
        with tarfile.open(fileobj=z, mode="r|") as tar:
            first = next(iter(tar))
            data = tar.extractfile(first)
            assert first.name == MANIFEST and data is not None
            return json.loads(data.read())  # type: ignore[no-any-return]


Entries = list[tuple[str, bytes]]
Manifest = dict[str, Any]


def craft(path: Path, entries: Entries) -> Path:
    """A zstd tar of ``entries`` (name, data), in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


def small(manifest: Manifest) -> tuple[Manifest, Entries]:
    """``manifest`` listing small stand-ins (right sizes and hashes) for its members, and
    those members in file order (vmlinuz first)."""
    names = [n for n in MEMBERS if n in manifest["members"]]
    data = {n: f"stand-in {n}".encode() for n in names}
    members = {
        n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in data.items()
    }
    return {**manifest, "members": members}, list(data.items())


def _manifest(listed: Manifest) -> tuple[str, bytes]:
    return (MANIFEST, json.dumps(listed).encode())


def _tampered(manifest: Manifest) -> Entries:
    listed, entries = small(manifest)
    name, content = entries[0]
    return [_manifest(listed), (name, content[:-1] + b"X"), *entries[1:]]  # same size


def _wrong_size(manifest: Manifest) -> Entries:
    listed, entries = small(manifest)
    name, content = entries[0]
    return [_manifest(listed), (name, content + b"more"), *entries[1:]]


def _escape(manifest: Manifest) -> Entries:
    listed, entries = small(manifest)
    return [_manifest(listed), ("../../escaped", b"x"), *entries]


def _lying_key(manifest: Manifest) -> Entries:
    listed, entries = small(manifest)
    fake = "0123456789abcdef"  # in both places, but not the hash of the inputs listed
    rootfs = {"key": fake, "manifest": {**listed["rootfs"]["manifest"], "key": fake}}
    return [_manifest({**listed, "rootfs": rootfs}), *entries]


def _manifest_last(manifest: Manifest) -> Entries:
    listed, entries = small(manifest)
    return [*entries, _manifest(listed)]


def _unknown_field(manifest: Manifest) -> Entries:
    listed, entries = small(manifest)
    return [_manifest({**listed, "extra": 1}), *entries]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_tampered, "checksum mismatch in vmlinuz"),
        (_wrong_size, "vmlinuz is not of its listed size"),
        (_escape, "unexpected entry '../../escaped'"),
        (_lying_key, "rootfs.key is not the key of the inputs"),
        (_manifest_last, "its manifest must come first"),
        (_unknown_field, "unknown field 'extra'"),
    ],
)
def test_crafted_files_are_refused(
    make: Callable[[Manifest], Entries], message: str, real_manifest: Manifest, tmp_path: Path
) -> None:
    bad = craft(tmp_path / "bad.sandfork-template", make(real_manifest))
    dest = tmp_path / "work" / "dest"
    with pytest.raises(TemplateError) as info:
        import_template(bad, dest)
    assert message in str(info.value)
    assert not (tmp_path / "work" / "escaped").exists() and not (tmp_path / "escaped").exists()
    left = [p for p in dest.rglob("*") if p.name != "build.lock"]
    assert all(p.is_dir() and not any(p.iterdir()) for p in left), left  # only empty areas
    result = sandfork("template", "import", str(bad), "--into", str(dest))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("sandfork: error: ")


def test_truncated_file_is_refused(exported: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.sandfork-template"
    with exported.open("rb") as f:
        cut.write_bytes(f.read(exported.stat().st_size // 2))
    dest = tmp_path / "dest"
    with pytest.raises(TemplateError, match="corrupted or truncated"):
        import_template(cut, dest)
    assert not [p for p in dest.rglob("*") if p.is_file() and p.name != "build.lock"]
