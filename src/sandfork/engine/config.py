"""The engine's configuration (traitlets: settable from the CLI and config files)."""

from __future__ import annotations

from traitlets import Bool, Enum, Float, Int, Unicode
from traitlets.config import LoggingConfigurable


class EngineConfig(LoggingConfigurable):
    """Settings of ``sandfork serve``."""

    ip = Unicode("127.0.0.1", help="Address to listen on. Loopback unless you mean it.").tag(
        config=True
    )
    port = Int(8765, help="TCP port of the HTTP API (0 picks a free one).").tag(config=True)
    state_dir = Unicode(
        "", help="Directory for the database, sandboxes and snapshots (default: SANDFORK_HOME)."
    ).tag(config=True)
    accelerator = Enum(
        ["auto", "kvm", "tcg"], "auto", help="QEMU accelerator; auto detects working KVM."
    ).tag(config=True)
    default_template = Unicode(
        "code-interpreter", help="Template of sandboxes created without one."
    ).tag(config=True)
    max_memory_mb = Int(16384, help="Largest memory a sandbox may ask for.").tag(config=True)
    max_cpus = Int(8, help="Most vCPUs a sandbox may ask for.").tag(config=True)
    max_output_bytes = Int(
        1024 * 1024,
        help="Per-stream cap on exec and run_code output; the rest is cut with a marker.",
    ).tag(config=True)
    boot_snapshots = Bool(
        True,
        help="Create sandboxes by restoring a pre-booted snapshot of their template "
        "(made on first use, cached) instead of booting each one.",
    ).tag(config=True)
    boot_timeout = Float(120.0, help="Seconds a new sandbox may take to answer.").tag(config=True)
    default_exec_timeout = Float(
        300.0, help="Timeout of an exec or run_code that names none, in seconds."
    ).tag(config=True)
