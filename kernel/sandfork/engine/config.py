"""The engine's configuration: every setting of ``sandfork serve`` is a trait here.

The engine reads an :class:`EngineConfig`; :class:`~sandfork.engine.cli.SandforkEngineApp`
fills it from ``sandfork_engine_config.py``, ``SANDFORK_<NAME>`` environment variables and the
command line (``--EngineConfig.<name>=<value>``), so a trait added here with ``config=True`` is
reachable from all three at once.
"""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Enum, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from sandfork.backends.agent_link import MAX_FRAME
from sandfork.protocol import DEFAULT_TEMPLATE
from sandfork.strict_json import MAX_JSON_DEPTH

MAX_FILE_BYTES = (MAX_FRAME - 2**16) // 4 * 3
"""Largest ``max_file_bytes``: a read's reply (base64, in one frame) must fit the agent
link's frame limit."""


class EngineConfig(LoggingConfigurable):
    """Settings of ``sandfork serve``."""

    ip = Unicode("127.0.0.1", help="Address to listen on. Loopback unless you mean it.").tag(
        config=True
    )
    port = Int(8765, help="TCP port of the HTTP API (0 picks a free one).").tag(config=True)
    state_dir = Unicode(
        "",
        help="Directory for the database, sandboxes and snapshots (default: $SANDFORK_HOME, "
        "else ~/.local/state/sandfork).",
    ).tag(config=True)
    accelerator = Enum(
        ["auto", "kvm", "tcg"], "auto", help="QEMU accelerator; auto detects working KVM."
    ).tag(config=True)
    backend = Enum(
        ["auto", "vm", "container"],
        "auto",
        help="What runs sandboxes by default: a QEMU VM, or a process tree in its own "
        "namespaces captured by CRIU. auto: the VM where KVM works, else the container "
        "(native speed; a VM under TCG runs code 17-154x slower), else the VM under TCG. A "
        "template or a create request may name one too.",
    ).tag(config=True)
    allow_container = Bool(
        True,
        help="Allow container sandboxes. False refuses them everywhere, for deployments "
        "that need the VM boundary between guests and the host.",
    ).tag(config=True)
    default_template = Unicode(
        DEFAULT_TEMPLATE, help="Template of sandboxes created without one."
    ).tag(config=True)
    max_memory_mb = Int(16384, help="Largest memory a sandbox may ask for.").tag(config=True)
    max_cpus = Int(8, help="Most vCPUs a sandbox may ask for.").tag(config=True)
    max_output_bytes = Int(
        1024 * 1024,
        help="Per-stream cap on exec and run_code output; the rest is cut with a marker.",
    ).tag(config=True)
    boot_captures = Bool(
        True,
        help="Create sandboxes by restoring a boot capture of their template "
        "(made on first use, cached) instead of booting each one.",
    ).tag(config=True)
    copy_memory = Bool(
        False,
        help="Copy guest memory whole at every capture (while the sandbox is paused) and "
        "every restore, instead of mapping snapshot images copy-on-write and storing what "
        "changed: the way before copy-on-write memory, kept to measure against.",
    ).tag(config=True)
    track_writes = Bool(
        True,
        help="Track the pages each VM writes (a userfaultfd registered in QEMU, scanned with "
        "PAGEMAP_SCAN; Linux 6.7 or later and a C compiler), so a capture costs what changed "
        "since the previous one; off, every capture compares every page written since the "
        "sandbox's memory image was mapped.",
    ).tag(config=True)
    boot_capture_dir = Unicode(
        "",
        help="Directory of the boot captures (default: "
        "<cache dir>/boot-captures, shared by every engine of the user).",
    ).tag(config=True)
    ram_dir = Unicode(
        "",
        help="Folder of this engine's VM sockets, booting VMs' zeroed RAM files and fork "
        "captures' device state (default: "
        "$SANDFORK_RAM_DIR, else a folder of its own in /dev/shm).",
    ).tag(config=True)
    max_sandboxes = Int(64, help="Most sandboxes running (or starting) at once.").tag(config=True)
    max_total_memory_mb = Int(
        0,
        help="Most memory of all running sandboxes together, in MiB "
        "(0: four times the machine's memory).",
    ).tag(config=True)
    snapshot_quota_mb = Int(
        0, help="Most disk all visible snapshots may take, in MiB (0: the free disk space)."
    ).tag(config=True)
    boot_timeout = Float(120.0, help="Seconds a new sandbox may take to answer.").tag(config=True)
    allow_host_access = Bool(
        False,
        help="Accept `host_access: true` when creating a sandbox: its guest then reaches the "
        "host's loopback services (at 10.0.2.2) and private networks directly. Off: every "
        "sandbox's network reaches only the egress proxy, which refuses such addresses.",
    ).tag(config=True)
    egress_allow_package_sources = Bool(
        True,
        help="Let sandboxes reach this host's package sources (pip's default index and file "
        "host, the index URLs of the host's pip configuration, the Debian mirror templates "
        "are built from) by name and port, whatever address they resolve to: a mirror on a "
        "private network or behind a TLS-inspecting gateway at a reserved address.",
    ).tag(config=True)
    egress_allow = List(
        Unicode(),
        help="Networks (CIDRs) the egress proxy lets sandboxes reach although they are "
        "private or local, e.g. a package mirror at 10.1.2.3/32.",
    ).tag(config=True)
    egress_max_streams_per_sandbox = Int(
        64,
        min=1,
        help="Most connections one sandbox may have open through the egress proxy at once; "
        "one past it is answered 503 at once (never queued).",
    ).tag(config=True)
    egress_max_streams = Int(
        1024,
        min=1,
        help="Most connections all sandboxes together may have open through the egress proxy "
        "at once (each holds one upstream socket of the engine); past it: 503 at once.",
    ).tag(config=True)
    default_exec_timeout = Float(
        300.0, help="Timeout of an exec or run_code that names none, in seconds."
    ).tag(config=True)
    # -- bounds on what a client or a guest can make large or slow (see docs/design-notes.md)
    max_request_bytes = Int(
        2**20, help="Largest JSON request body; a larger one is answered with 413."
    ).tag(config=True)
    max_port_request_bytes = Int(
        64 * 2**20,
        help="Largest request body the port proxy relays to a server in a sandbox (it is held "
        "in memory until sent); a larger one is answered with 413.",
    ).tag(config=True)
    max_file_bytes = Int(
        32 * 2**20,
        help="Largest file the files API writes or reads in one request (larger reads: "
        f"ranges); at most {MAX_FILE_BYTES}, what one frame of the agent link can carry.",
    ).tag(config=True)

    @validate("max_file_bytes")
    def _fits_a_frame(self, proposal: dict[str, Any]) -> int:
        value = int(proposal["value"])
        if not 0 < value <= MAX_FILE_BYTES:
            raise TraitError(f"max_file_bytes must be from 1 to {MAX_FILE_BYTES}, got {value}")
        return value

    max_json_depth = Int(
        MAX_JSON_DEPTH, help="Deepest nesting of arrays and objects in a JSON body."
    ).tag(config=True)
    max_metadata_keys = Int(64, help="Most keys in a sandbox's or snapshot's metadata.").tag(
        config=True
    )
    max_metadata_key_chars = Int(128, help="Longest metadata key, in characters.").tag(config=True)
    max_metadata_value_bytes = Int(4096, help="Largest metadata value, in UTF-8 bytes.").tag(
        config=True
    )
    max_metadata_bytes = Int(16384, help="Largest metadata in all (keys and values, UTF-8).").tag(
        config=True
    )
    header_timeout = Float(
        10.0,
        min=0.001,
        help="Seconds a new connection has to send its first request's headers; a client "
        "slower than that (a byte at a time, say) is disconnected.",
    ).tag(config=True)
    idle_timeout = Float(
        60.0,
        min=0.001,
        help="Seconds a kept-alive connection may wait for its next request's headers "
        "(idle time and headers together, as tornado counts them) before it is closed.",
    ).tag(config=True)
    body_timeout = Float(
        60.0,
        min=0.0,
        help="Slack of a request body's minimum rate: a body may take this many seconds plus "
        "one second for every body_min_rate bytes received. Slower, it is answered 408 and "
        "its connection closed. A rate rather than a total time: an upload of gigabytes that "
        "keeps coming is never cut.",
    ).tag(config=True)
    body_min_rate = Int(
        16 * 1024,
        min=1,
        help="Bytes per second a request body must average after body_timeout's slack.",
    ).tag(config=True)
    agent_timeout = Float(
        30.0,
        help="Seconds the guest agent may take to answer a request (exec and run_code: their "
        "timeout plus this); past it the sandbox is reported unresponsive (504).",
    ).tag(config=True)
    hibernate_wait = Float(
        30.0,
        help="Seconds a hibernation waits for the work running in its sandbox (API calls, "
        "and cells its kernels run for a notebook) to finish; past it the hibernation is "
        "refused with 409 'busy' and the sandbox runs on. 0: refuse at once when busy.",
    ).tag(config=True)
    inventory_timeout = Float(
        2.0,
        help="Seconds a snapshot waits for the variable inventory of the sandbox's default "
        "kernel; a kernel still busy with a cell then gets an inventory marked unavailable "
        "(the cell is not interrupted).",
    ).tag(config=True)
    snapshot_store = Enum(
        ["local", "s3"],
        "local",
        help="Where snapshots are kept. local: on this engine's disk only. s3: also in the "
        "S3 bucket of the S3Store settings (--S3Store.endpoint_url, --S3Store.bucket; "
        "credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), uploaded in the "
        "background after each capture, so any engine sharing the bucket restores them.",
    ).tag(config=True)
    lazy_fetch = Bool(
        True,
        help="Restore a container snapshot fetched from the snapshot store before its memory "
        "is all here: the pages the sandbox touches first come first, the rest behind them "
        "(needs /dev/fuse; without it, or with False, the whole snapshot is fetched first).",
    ).tag(config=True)
    chunk_cache_mb = Int(
        4096,
        min=0,
        help="Most disk, in MiB, the local cache of chunks fetched from the snapshot store "
        "takes (least recently used out first).",
    ).tag(config=True)
    gateway_url = Unicode(
        "",
        help="A gateway (sandfork gateway) this engine registers with and sends heartbeats "
        "to, e.g. http://10.0.0.5:8770; empty: none.",
    ).tag(config=True)
    gateway_key = Unicode(
        "", help="This engine's key at the gateway (the gateway's engine_keys names it)."
    ).tag(config=True)
    gateway_engine_name = Unicode(
        "", help="This engine's name at the gateway (default: the host name)."
    ).tag(config=True)
    gateway_engine_url = Unicode(
        "",
        help="The URL the gateway reaches this engine at (default: the one it listens on).",
    ).tag(config=True)
    gateway_heartbeat_interval = Float(
        2.0, min=0.05, help="Seconds between two heartbeats to the gateway."
    ).tag(config=True)
