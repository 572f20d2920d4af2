"""Every engine setting is reachable from a config file, the environment and the command line.

The settings are read from the traits of the engine's configurables, so a new trait is
covered without touching this file (a trait of a new type needs a value in ``_other_value``).
No engine is started: the application is only initialized.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from traitlets import Bool, Enum, Float, Int, List, TraitType, Unicode
from traitlets.config import Configurable

from sandfork.backends.agent_link import MAX_FRAME
from sandfork.engine.cli import (
    CONFIG_FILE_NAME,
    HOME_ENV,
    EngineConfigError,
    SandforkEngineApp,
    env_name,
)
from sandfork.engine.config import MAX_FILE_BYTES

ENGINE_CLASSES: list[type[Configurable]] = [
    cls for cls in SandforkEngineApp.classes if cls is not SandforkEngineApp
]
SETTINGS = [
    (cls, name, trait)
    for cls in ENGINE_CLASSES
    for name, trait in sorted(cls.class_traits(config=True).items())
]
CLIENT_ENV = {  # variables read elsewhere (SDKs, kernel, paths.py, tests): no setting's name
    "SANDFORK_API",
    "SANDFORK_API_KEY",
    "SANDFORK_SANDBOX_ID",
    "SANDFORK_CONTEXT",
    "SANDFORK_LEASE_SECONDS",
    "SANDFORK_OWN_SANDBOX",
    "SANDFORK_CACHE_DIR",
    "SANDFORK_CONFIG_DIR",
    "SANDFORK_TEMPLATES_DIR",
    "SANDFORK_APT_MIRROR",
    "SANDFORK_CRASH_AT",
    "SANDFORK_BIN",
    HOME_ENV,
}


def _other_value(name: str, trait: TraitType[Any, Any], default: Any) -> Any:
    """A valid value of ``trait`` that is not its default."""
    if isinstance(trait, Bool):
        return not default
    if isinstance(trait, Enum):
        return next(v for v in trait.values or () if v != default)
    if isinstance(trait, Int):
        return default + 7
    if isinstance(trait, Float):
        return default + 0.5
    if isinstance(trait, Unicode):
        return f"/nondefault/{name}"
    if isinstance(trait, List):
        return ["192.0.2.0/24", "198.51.100.7/32"]
    raise AssertionError(f"no test value for {name} ({type(trait).__name__}): add one here")


def _as_env(value: Any) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)


def _other_values() -> dict[tuple[str, str], Any]:
    values = {}
    for cls, name, trait in SETTINGS:
        value = _other_value(name, trait, getattr(cls(), name))
        assert value != getattr(cls(), name)
        values[cls.__name__, name] = value
    return values


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No engine setting from the environment; an empty user config folder."""
    for cls, name, _ in SETTINGS:
        monkeypatch.delenv(env_name(name, cls), raising=False)
    monkeypatch.delenv(HOME_ENV, raising=False)
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    monkeypatch.setenv("SANDFORK_CONFIG_DIR", str(config_dir))
    return config_dir


def _configured(argv: list[str]) -> dict[tuple[str, str], Any]:
    """Every setting's value once the application has read ``argv``, files and environment."""
    app = SandforkEngineApp()
    app.initialize(argv)
    objects = {cls: cls(parent=app) for cls in ENGINE_CLASSES}
    return {(cls.__name__, name): getattr(objects[cls], name) for cls, name, _ in SETTINGS}


def _write_config(path: Path, values: dict[tuple[str, str], Any]) -> None:
    lines = [f"c.{cls}.{name} = {value!r}" for (cls, name), value in values.items()]
    path.write_text("\n".join(lines) + "\n")


def test_the_engine_has_settings() -> None:
    assert ENGINE_CLASSES and len(SETTINGS) > 20


def test_every_setting_from_the_user_config_file(clean_env: Path) -> None:
    values = _other_values()
    _write_config(clean_env / f"{CONFIG_FILE_NAME}.py", values)
    assert _configured([]) == values


def test_every_setting_from_a_config_file_named_on_the_command_line(tmp_path: Path) -> None:
    values = _other_values()
    _write_config(tmp_path / "mine.py", values)
    assert _configured([f"--config={tmp_path / 'mine.py'}"]) == values


def test_every_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    values = _other_values()
    classes = {cls.__name__: cls for cls in ENGINE_CLASSES}
    for (cls, name), value in values.items():
        assert env_name(name, classes[cls]) not in CLIENT_ENV
        monkeypatch.setenv(env_name(name, classes[cls]), _as_env(value))
    assert _configured([]) == values


def test_every_setting_from_the_command_line() -> None:
    values = _other_values()
    argv = []
    for (cls, name), value in values.items():
        for item in value if isinstance(value, list) else [value]:
            argv.append(f"--{cls}.{name}={item}")
    assert _configured(argv) == values


def test_precedence_command_line_over_environment_over_files(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    user_file = clean_env / f"{CONFIG_FILE_NAME}.py"
    user_file.write_text(
        "c.EngineConfig.port = 1001\nc.EngineConfig.max_cpus = 3\n"
        "c.EngineConfig.max_sandboxes = 5\nc.EngineConfig.boot_timeout = 9.0\n"
    )
    explicit = tmp_path / "explicit.py"
    explicit.write_text("c.EngineConfig.max_cpus = 4\nc.EngineConfig.max_sandboxes = 6\n")
    monkeypatch.setenv("SANDFORK_MAX_SANDBOXES", "7")
    monkeypatch.setenv("SANDFORK_PORT", "1002")
    got = _configured([f"--config={explicit}", "--port", "1003"])
    assert got["EngineConfig", "boot_timeout"] == 9.0  # the user's file alone
    assert got["EngineConfig", "max_cpus"] == 4  # --config over the user's file
    assert got["EngineConfig", "max_sandboxes"] == 7  # the environment over both files
    assert got["EngineConfig", "port"] == 1003  # the command line over everything


def test_state_dir_from_sandfork_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOME_ENV, "/from/home")
    assert _configured([])["EngineConfig", "state_dir"] == "/from/home"
    monkeypatch.setenv("SANDFORK_STATE_DIR", "/from/state-dir")  # as in paths.state_dir()
    assert _configured([])["EngineConfig", "state_dir"] == "/from/state-dir"
    assert _configured(["--state-dir", "/flag"])["EngineConfig", "state_dir"] == "/flag"


def test_short_flags_and_aliases() -> None:
    got = _configured(
        [
            "--ip=0.0.0.0",
            "--port",
            "0",
            "--accelerator",
            "tcg",
            "--no-boot-captures",
            "--allow-host-access",
            "--boot-capture-dir",
            "/captures",
            "--egress-allow",
            "10.1.2.3/32",
            "--egress-allow",
            "10.9.0.0/16",
        ]
    )
    assert got["EngineConfig", "ip"] == "0.0.0.0"
    assert got["EngineConfig", "port"] == 0
    assert got["EngineConfig", "accelerator"] == "tcg"
    assert got["EngineConfig", "boot_captures"] is False
    assert got["EngineConfig", "allow_host_access"] is True
    assert got["EngineConfig", "boot_capture_dir"] == "/captures"
    assert got["EngineConfig", "egress_allow"] == ["10.1.2.3/32", "10.9.0.0/16"]


def test_help_all_lists_every_setting() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sandfork", "serve", "--help-all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for cls, name, trait in SETTINGS:
        assert f"--{cls.__name__}.{name}=" in out
        assert trait.help, f"{cls.__name__}.{name} has no help"
    assert CONFIG_FILE_NAME in out


def test_show_config_prints_the_settings_without_serving(clean_env: Path) -> None:
    (clean_env / f"{CONFIG_FILE_NAME}.py").write_text("c.EngineConfig.max_cpus = 3\n")
    result = subprocess.run(
        [sys.executable, "-m", "sandfork", "serve", "--show-config", "--port", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "SANDFORK_MAX_SANDBOXES": "9"},
        timeout=60,
        check=True,
    )
    assert str(clean_env / f"{CONFIG_FILE_NAME}.py") in result.stdout
    for line in (".max_cpus = 3", ".max_sandboxes = 9", ".port = 0"):
        assert line in result.stdout


def test_file_reads_must_fit_one_frame_of_the_agent_link() -> None:
    """A read's reply crosses the agent link as one base64 frame: a larger max_file_bytes
    would make every big read fail, so the engine refuses it at start."""
    app = SandforkEngineApp()
    app.initialize([f"--EngineConfig.max_file_bytes={MAX_FILE_BYTES + 1}"])
    with pytest.raises(EngineConfigError, match="max_file_bytes must be from 1 to"):
        app.engine_config()
    app = SandforkEngineApp()
    app.initialize([f"--EngineConfig.max_file_bytes={MAX_FILE_BYTES}"])
    assert app.engine_config().max_file_bytes == MAX_FILE_BYTES
    assert (MAX_FILE_BYTES + 2) // 3 * 4 + 2**10 < MAX_FRAME


@pytest.mark.parametrize("where", ["command line", "config file"])
def test_a_misspelt_setting_stops_the_engine_with_one_line(clean_env: Path, where: str) -> None:
    """traitlets alone only warns, and the engine would run without the setting."""
    argv = [sys.executable, "-m", "sandfork", "serve", "--port", "0"]
    if where == "command line":
        argv.append("--EngineConfig.max_sandboxs=3")
    else:
        (clean_env / f"{CONFIG_FILE_NAME}.py").write_text("c.EngineConfig.max_sandboxs = 3\n")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.splitlines()[0] == (
        "sandfork: error: unknown setting: EngineConfig.max_sandboxs "
        "(did you mean EngineConfig.max_sandboxes?)"
    ), result.stderr
    assert "Traceback" not in result.stderr
