"""Every limit and default the engine and its clients share, defined once."""

from __future__ import annotations

MAX_FORKS = 16  # children of one fork-tree call
MAX_BRANCHES = 8  # branch notebooks of one fork in JupyterLab (the server extension's default)
MAX_SNAPSHOT_NAME = 200  # characters
MAX_ATTACHMENT_BYTES = 64 * 2**20  # all attachments of one snapshot together
MIN_MEMORY_MB = 256  # of a sandbox, a template and an imported snapshot alike
DEFAULT_MEMORY_MB = 1024  # of a template that names none
CHECKPOINTS_KEPT = 20  # per-cell checkpoints a notebook kernel keeps (older ones deleted)
MAX_CHECKPOINTS_KEPT = 10_000  # the most a kernel may be asked to keep
DEFAULT_TEMPLATE = "code-interpreter"  # what a sandbox is created from when none is named
