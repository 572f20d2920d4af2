"""The engine process: the tornado application, its runtime files and its life cycle."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Any

from tornado import web
from tornado.netutil import bind_sockets

from sandfork.backends.container.backend import ContainerBackend
from sandfork.backends.vm.backend import VmBackend
from sandfork.backends.vm.qemu import default_ram_dir
from sandfork.engine.backends import Backends
from sandfork.engine.boot_captures import BootCaptures
from sandfork.engine.config import EngineConfig
from sandfork.engine.db import Database
from sandfork.engine.egress import EgressProxy
from sandfork.engine.egress_policy import exempting
from sandfork.engine.egress_tunnel import EgressTunnels
from sandfork.engine.errors import NotFound
from sandfork.engine.gateway_link import GatewayLink
from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.handlers.changes import ChangesHandler
from sandfork.engine.handlers.channels import ChannelsHandler
from sandfork.engine.handlers.exec import ExecHandler, ExecStreamHandler, RecordedExecStreamHandler
from sandfork.engine.handlers.files import DirHandler, FileHandler, StatHandler
from sandfork.engine.handlers.hibernation import HibernateHandler, PauseHandler, WakeHandler
from sandfork.engine.handlers.leases import LeaseHandler, LifecycleHandler
from sandfork.engine.handlers.logs import LogsHandler
from sandfork.engine.handlers.not_served import PANDASTACK_ONLY, NotServedHandler
from sandfork.engine.handlers.ports import PortProxyHandler, PortsHandler
from sandfork.engine.handlers.promote import PromoteHandler
from sandfork.engine.handlers.repl import (
    InterruptHandler,
    RestartHandler,
    RunHandler,
    SessionHandler,
    SessionsHandler,
)
from sandfork.engine.handlers.sandboxes import SandboxesHandler, SandboxHandler
from sandfork.engine.handlers.snapshots import (
    AttachmentHandler,
    CheckpointsHandler,
    ExportHandler,
    ForkHandler,
    ForkTreeHandler,
    ImportHandler,
    LedgerHandler,
    ResumeHandler,
    SandboxSnapshotsHandler,
    SnapshotHandler,
    SnapshotsHandler,
)
from sandfork.engine.handlers.stats import EngineStatsHandler
from sandfork.engine.handlers.templates import HealthHandler, TemplateHandler, TemplatesHandler
from sandfork.engine.http_server import EngineHTTPServer
from sandfork.engine.limits import Limits
from sandfork.engine.package_sources import package_sources
from sandfork.engine.services import Bounds, EngineServices
from sandfork.engine.stored import lazy_servers, open_store
from sandfork.paths import cache_dir, state_dir
from sandfork.protocol import CONTEXT_ID, SANDBOX_ID, SNAPSHOT_ID
from sandfork.serving import load_or_create_key, publish

log = logging.getLogger(__name__)

_SBX = f"({SANDBOX_ID})"
_CTX = f"({CONTEXT_ID})"
_SNAP = f"({SNAPSHOT_ID})"


class NotFoundHandler(ApiHandler):
    """Any other path: authenticated like the rest, then a JSON 404."""

    def check_request(self) -> None:
        super().check_request()
        raise NotFound(f"no such endpoint: {self.request.method} {self.request.path}")


def make_app(services: EngineServices, config: EngineConfig, api_key: str) -> web.Application:
    """The tornado application serving the ``/v1`` API."""
    routes: list[Any] = [
        (r"/v1/health", HealthHandler),
        (r"/v1/engine/stats", EngineStatsHandler),
        (r"/v1/templates", TemplatesHandler),
        (r"/v1/templates/(builds?(?:/.*)?)", NotServedHandler),
        (r"/v1/templates/([^/]+)", TemplateHandler),
        (rf"/v1/({'|'.join(PANDASTACK_ONLY)})(/.*)?", NotServedHandler),
        (r"/v1/changes", ChangesHandler),
        (r"/v1/sandboxes", SandboxesHandler),
        (rf"/v1/sandboxes/{_SBX}", SandboxHandler),
        (rf"/v1/sandboxes/{_SBX}/lease", LeaseHandler),
        (rf"/v1/sandboxes/{_SBX}/lifecycle", LifecycleHandler),
        (rf"/v1/sandboxes/{_SBX}/exec", ExecHandler),
        (rf"/v1/sandboxes/{_SBX}/exec/stream", ExecStreamHandler),
        (rf"/v1/sandboxes/{_SBX}/exec/stream/ledgered", RecordedExecStreamHandler),
        (rf"/v1/sandboxes/{_SBX}/promote", PromoteHandler),
        (rf"/v1/sandboxes/{_SBX}/hibernate", HibernateHandler),
        (rf"/v1/sandboxes/{_SBX}/wake", WakeHandler),
        (rf"/v1/sandboxes/{_SBX}/pause", PauseHandler),
        (rf"/v1/sandboxes/{_SBX}/logs", LogsHandler),
        (rf"/v1/sandboxes/{_SBX}/ports", PortsHandler),
        (rf"/v1/sandboxes/{_SBX}/ports/([^/]+)/?(.*)", PortProxyHandler),
        (rf"/v1/sandboxes/{_SBX}/fs", FileHandler),
        (rf"/v1/sandboxes/{_SBX}/fs/dir", DirHandler),
        (rf"/v1/sandboxes/{_SBX}/fs/stat", StatHandler),
        (rf"/v1/sandboxes/{_SBX}/repl/sessions", SessionsHandler),
        (rf"/v1/sandboxes/{_SBX}/repl/sessions/{_CTX}", SessionHandler),
        (rf"/v1/sandboxes/{_SBX}/repl/sessions/{_CTX}/run", RunHandler),
        (rf"/v1/sandboxes/{_SBX}/repl/sessions/{_CTX}/channels", ChannelsHandler),
        (rf"/v1/sandboxes/{_SBX}/repl/sessions/{_CTX}/interrupt", InterruptHandler),
        (rf"/v1/sandboxes/{_SBX}/repl/sessions/{_CTX}/restart", RestartHandler),
        (rf"/v1/sandboxes/{_SBX}/snapshots", SandboxSnapshotsHandler),
        (rf"/v1/sandboxes/{_SBX}/fork", ForkHandler),
        (rf"/v1/sandboxes/{_SBX}/fork-tree", ForkTreeHandler),
        (rf"/v1/sandboxes/{_SBX}/checkpoints", CheckpointsHandler),
        (rf"/v1/sandboxes/{_SBX}/resume", ResumeHandler),
        (rf"/v1/sandboxes/{_SBX}/ledger", LedgerHandler),
        (r"/v1/snapshots", SnapshotsHandler),
        (rf"/v1/snapshots/{_SNAP}", SnapshotHandler),
        (rf"/v1/snapshots/{_SNAP}/export", ExportHandler),
        (rf"/v1/snapshots/{_SNAP}/attachments/([^/]+)", AttachmentHandler),
        (r"/v1/snapshots/import", ImportHandler),
    ]
    return web.Application(
        routes,
        default_handler_class=NotFoundHandler,
        services=services,
        config=config,
        api_key=api_key,
        max_body_size=256 * 1024 * 1024,
    )


async def serve(config: EngineConfig) -> None:
    """Run the engine until SIGINT/SIGTERM; sandboxes keep running after it stops."""
    os.umask(0o077)  # the database (command output), guest RAM and snapshots are private
    home = Path(config.state_dir) if config.state_dir else state_dir()
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    runtime = home / "run"
    api_key = load_or_create_key(runtime / "api_key", "sfk_")
    chunks = open_store(config, home)  # a store that cannot be used stops the start here
    db = Database(home / "engine.sqlite")
    ram = Path(config.ram_dir) if config.ram_dir else default_ram_dir(home)
    ram.mkdir(parents=True, exist_ok=True, mode=0o700)
    vm = VmBackend(
        ram,
        config.accelerator,
        config.boot_timeout,
        copy_memory=config.copy_memory,
        track_writes=config.track_writes,
    )
    # The guests' only way out (engine/egress.py), over each sandbox's egress channel.
    egress = EgressTunnels(
        EgressProxy(
            exempting(config.egress_allow),
            package_sources() if config.egress_allow_package_sources else frozenset(),
        ),
        max_streams_per_sandbox=config.egress_max_streams_per_sandbox,
        max_streams=config.egress_max_streams,
    )
    container = ContainerBackend(ram, home, config.boot_timeout)
    backends = Backends({"vm": vm, "container": container}, config.backend, config.allow_container)
    captures_dir = Path(config.boot_capture_dir or cache_dir() / "boot-captures")
    captures = BootCaptures(captures_dir, backends.all()) if config.boot_captures else None
    services = EngineServices.build(
        db,
        backends,
        home,
        captures,
        ram / "staging",
        Limits(
            max_sandboxes=config.max_sandboxes,
            max_total_memory_mb=config.max_total_memory_mb,
            snapshot_quota_mb=config.snapshot_quota_mb,
            snapshots_dir=home,
        ),
        Bounds(
            max_output=config.max_output_bytes,
            default_timeout=config.default_exec_timeout,
            agent_timeout=config.agent_timeout,
            max_file_bytes=config.max_file_bytes,
            inventory_timeout=config.inventory_timeout,
            hibernate_wait=config.hibernate_wait,
            max_memory_mb=config.max_memory_mb,
            max_cpus=config.max_cpus,
        ),
        egress,
        chunks,
        lazy_servers(config, home),
    )
    await services.start()
    sockets = bind_sockets(config.port, address=config.ip)
    server = EngineHTTPServer(
        make_app(services, config, api_key),
        max_body_size=256 * 1024 * 1024,
        idle_connection_timeout=config.idle_timeout,
        header_timeout=config.header_timeout,
    )
    server.add_sockets(sockets)
    info = runtime / "engine.json"
    url = publish(sockets, config.ip, info)
    log.info(
        "sandfork engine on %s (backend %s: %s; VM accelerator: %s, %s; containers: %s)",
        url,
        backends.default,
        backends.why,
        vm.accel.name,
        vm.accel.reason,
        backends.reasons.get("container") or "available",
    )
    link = GatewayLink(config, url, api_key, services.sandboxes) if config.gateway_url else None
    heartbeats = asyncio.create_task(link.run()) if link is not None else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        if heartbeats is not None:
            heartbeats.cancel()
        server.stop()
        info.unlink(missing_ok=True)
        await services.stop()
        db.close()
