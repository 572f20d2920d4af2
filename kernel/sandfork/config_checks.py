"""A setting nobody reads is an error: traitlets only logs a warning for ``--EngineConfig.
mmeory_mb=…`` or a misspelt name in a config file, and the program then runs without it."""

from __future__ import annotations

import difflib

from traitlets.config import Application, Config


def unknown_settings(app: Application) -> str | None:
    """One line naming each setting of ``app``'s own classes that is no setting of theirs
    (with the nearest real name), or None when every one is real. Sections of other classes
    are left alone: a shared config file may configure other programs too."""
    known = {cls.__name__: cls.class_trait_names(config=True) for cls in [type(app), *app.classes]}
    wrong = []
    for section, values in app.config.items():
        names = known.get(section)
        if names is None or not isinstance(values, Config):
            continue
        for name in values:
            if name not in names:
                near = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {section}.{near[0]}?)" if near else ""
                wrong.append(f"{section}.{name}{hint}")
    if not wrong:
        return None
    return f"unknown setting{'s' if len(wrong) > 1 else ''}: {', '.join(sorted(wrong))}"
