"""A setting nobody reads is an error: traitlets only logs a warning for ``--EngineConfig.
mmeory_mb=…`` or a misspelt name in a config file, and the program then runs without it."""

from __future__ import annotations

import difflib

from traitlets.config import Application, Config, Configurable


def _sections(app: Application) -> dict[str, list[str]]:
    """The config sections ``app`` reads (its classes and their configurable bases), and the
    settings of each."""
    known: dict[str, set[str]] = {}
    for cls in (type(app), *app.classes):
        for klass in cls.mro():
            if isinstance(klass, type) and issubclass(klass, Configurable):
                known.setdefault(klass.__name__, set()).update(klass.class_trait_names(config=True))
    return {name: sorted(traits) for name, traits in known.items()}


def _nearest(name: str, names: list[str], prefix: str = "") -> str:
    near = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {prefix}{near[0]}?)" if near else ""


def unknown_settings(app: Application) -> str | None:
    """One line naming each setting ``app`` was given that it has not (with the nearest real
    name), or None when every one is real. A config file's sections of other programs are
    left alone (one file may configure several); the command line configures this one only."""
    known = _sections(app)
    wrong = []
    for section, values in app.config.items():
        names = known.get(section)
        if names is None:
            if section in app.cli_config:
                wrong.append(f"{section}{_nearest(section, list(known))}")
            continue
        if isinstance(values, Config):
            wrong += [
                f"{section}.{n}{_nearest(n, names, f'{section}.')}"
                for n in values
                if n not in names
            ]
    if not wrong:
        return None
    return f"unknown setting{'s' if len(wrong) > 1 else ''}: {', '.join(sorted(wrong))}"
