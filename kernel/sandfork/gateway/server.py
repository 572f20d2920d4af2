"""The gateway process: its tornado application, its runtime files and its life cycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Any

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.routing import PathMatches, Rule

from sandfork.gateway.config import GatewayConfig
from sandfork.gateway.fleet import Fleet
from sandfork.gateway.fleet_handlers import (
    ChangesHandler,
    EnginesHandler,
    HealthHandler,
    HeartbeatHandler,
    SandboxesHandler,
    SnapshotHandler,
    SnapshotsHandler,
)
from sandfork.gateway.forks import ForkHandler
from sandfork.gateway.relay import RelayHandler
from sandfork.gateway.websockets import UpgradeUnderSandbox, WebSocketRelay
from sandfork.paths import state_dir
from sandfork.protocol import SANDBOX_ID, SNAPSHOT_ID, routes
from sandfork.serving import load_or_create_key, publish

log = logging.getLogger(__name__)
access = logging.getLogger("tornado.access")

_LIVENESS_S = 0.2  # how often silent engines are looked for (the change feed wakes on them)


def make_app(fleet: Fleet, config: GatewayConfig, api_key: str) -> web.Application:
    """The gateway's application: the fleet's own endpoints, then the relays."""
    api = routes.API
    rules: list[Any] = [
        Rule(UpgradeUnderSandbox(), WebSocketRelay),
        (api + routes.GATEWAY_HEARTBEAT, HeartbeatHandler),
        (api + routes.GATEWAY_ENGINES, EnginesHandler),
        (api + routes.HEALTH, HealthHandler),
        (api + routes.CHANGES, ChangesHandler),
        (api + routes.SANDBOXES, SandboxesHandler),
        (api + routes.SNAPSHOTS, SnapshotsHandler),
        (rf"{api}{routes.SANDBOXES}/({SANDBOX_ID})/(fork|fork-tree)", ForkHandler),
        (rf"{api}{routes.SNAPSHOTS}/({SNAPSHOT_ID})", SnapshotHandler),
        Rule(PathMatches(r"/.*"), RelayHandler),
    ]
    return web.Application(
        rules,
        fleet=fleet,
        config=config,
        api_key=api_key,
        websocket_ping_interval=30,
        log_function=_log_request,
    )


def _log_request(handler: web.RequestHandler) -> None:
    """tornado's access log, without the heartbeats that were taken (several a second)."""
    if isinstance(handler, HeartbeatHandler) and handler.get_status() < 400:
        return
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING
    request = handler.request
    took = 1000.0 * request.request_time()
    access.log(
        level, "%d %s %s (%s) %.2fms", status, request.method, request.uri, request.remote_ip, took
    )


def gateway_home(config: GatewayConfig) -> Path:
    """The gateway's state directory."""
    return Path(config.state_dir) if config.state_dir else state_dir() / "gateway"


async def _watch_liveness(fleet: Fleet) -> None:
    while True:
        fleet.check_liveness()
        await asyncio.sleep(_LIVENESS_S)


async def serve(config: GatewayConfig) -> None:
    """Run the gateway until SIGINT/SIGTERM."""
    os.umask(0o077)
    home = gateway_home(config)
    runtime = home / "run"
    runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
    home.chmod(0o700)
    runtime.chmod(0o700)
    api_key = config.api_key or load_or_create_key(runtime / "api_key", "sfg_")
    if not config.engine_keys:
        log.warning("no engine_keys configured: no engine can register with this gateway")
    fleet = Fleet(dict(config.engine_keys), config.missed_heartbeats)
    sockets = bind_sockets(config.port, address=config.ip)
    http = HTTPServer(make_app(fleet, config, api_key), idle_connection_timeout=60)
    http.add_sockets(sockets)
    info = runtime / "gateway.json"
    url = publish(sockets, config.ip, info)
    log.info("sandfork gateway on %s (%d engine keys)", url, len(config.engine_keys))
    watcher = asyncio.create_task(_watch_liveness(fleet))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        http.stop()
        info.unlink(missing_ok=True)
