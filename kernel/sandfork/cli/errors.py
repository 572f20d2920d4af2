"""Expected failures of the ``sandfork`` command: one line, a hint, no traceback."""

from __future__ import annotations

import errno
import sys
from dataclasses import dataclass

__all__ = ["Failure", "describe", "report"]

DEBUG_HINT = "--debug shows the traceback"


@dataclass(frozen=True)
class Failure:
    """What the command prints for an expected failure, and its exit code."""

    message: str
    hint: str
    exit_code: int = 1


def _sdk_hint(error: Exception) -> str:
    from sandfork.sdk.errors import AuthError, LimitExceeded, NotFoundError

    if isinstance(error, NotFoundError):
        return "`sandfork sandbox ls` and `sandfork snapshot ls` list the ids that exist"
    if isinstance(error, AuthError):
        return "check SANDFORK_API_KEY, or unset SANDFORK_API to use the local engine"
    if isinstance(error, LimitExceeded):
        return (
            "kill sandboxes or delete snapshots, or raise the engine's limits "
            "(`sandfork serve --help-all` lists them)"
        )
    if "engine" in str(error) and ("start" in str(error) or "connect" in str(error)):
        return "`sandfork doctor` checks the host; the engine's log is in its state folder"
    return DEBUG_HINT


def _os_hint(error: OSError) -> str:
    if isinstance(error, FileNotFoundError):
        if error.filename is None:  # a missing program (QEMU, debootstrap), named in the text
            return "install the host tools with `bash scripts/setup.sh`; `sandfork doctor` checks"
        return "check the path"
    if isinstance(error, PermissionError):
        where = f" {error.filename}" if error.filename else ""
        return f"run as a user allowed to use{where}; `sandfork doctor` checks this host"
    if error.errno == errno.EADDRINUSE:
        return "another program (an engine?) has this port: pick another, or --port 0"
    return DEBUG_HINT


def describe(error: BaseException) -> Failure | None:
    """The failure to print for an expected error; ``None`` for a bug (a traceback)."""
    from traitlets import TraitError

    from sandfork.backends.container.criu import CriuError
    from sandfork.engine.cli import EngineConfigError
    from sandfork.gateway.cli import GatewayConfigError
    from sandfork.sdk.errors import SandforkError
    from sandfork.store.objects import StoreError
    from sandfork.templates.errors import TemplateError

    if isinstance(error, KeyboardInterrupt):
        return Failure("interrupted", "", 130)
    if isinstance(error, EngineConfigError | TraitError):
        return Failure(str(error), "`sandfork serve --help-all` lists every setting and its type")
    if isinstance(error, GatewayConfigError):
        return Failure(str(error), "`sandfork gateway --help-all` lists every setting")
    if isinstance(error, SandforkError):
        return Failure(str(error), _sdk_hint(error))
    if isinstance(error, TemplateError):
        host = str(error).startswith("cannot build templates here")
        hint = "`sandfork doctor` checks this host" if host else DEBUG_HINT
        if str(error).startswith("unknown template"):
            hint = "`sandfork template list` shows the templates"
        return Failure(str(error), hint)
    if isinstance(error, StoreError):
        return Failure(
            f"the snapshot store cannot be used: {error}",
            "check --S3Store.endpoint_url, --S3Store.bucket and the AWS_* credentials",
        )
    if isinstance(error, CriuError):
        return Failure(str(error), "`sandfork doctor` says what the container backend lacks")
    if isinstance(error, OSError):
        return Failure(str(error), _os_hint(error))
    return None


def report(failure: Failure) -> int:
    """Print ``failure`` on stderr; its exit code."""
    first, *rest = failure.message.strip().splitlines() or [""]
    lines = [f"sandfork: error: {first}", *(f"  {line}" for line in rest)]
    if failure.hint:
        lines.append(f"hint: {failure.hint}")
    print("\n".join(lines), file=sys.stderr)
    return failure.exit_code
