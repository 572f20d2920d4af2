"""Settings of ``sandfork gateway`` (:class:`GatewayConfig`)."""

from __future__ import annotations

from traitlets import Dict, Float, Int, Unicode
from traitlets.config import LoggingConfigurable


class GatewayConfig(LoggingConfigurable):
    """Settings of ``sandfork gateway``: where it listens, its keys, and how long an engine
    may stay silent."""

    ip = Unicode("127.0.0.1", help="Address to listen on. Loopback unless you mean it.").tag(
        config=True
    )
    port = Int(8770, help="TCP port of the gateway's /v1 API (0 picks a free one).").tag(
        config=True
    )
    state_dir = Unicode(
        "",
        help="Directory of the gateway's runtime files (run/gateway.json, run/api_key); "
        "default: the 'gateway' folder of Sandfork's state directory.",
    ).tag(config=True)
    api_key = Unicode(
        "",
        help="The key clients send (Authorization: Bearer); empty: one is generated on first "
        "start and kept in <state_dir>/run/api_key (mode 0600).",
    ).tag(config=True)
    engine_keys = Dict(
        value_trait=Unicode(),
        per_key_traits=None,
        help="The engines that may register: {name: key}. An engine sends its name and key "
        "with every heartbeat (EngineConfig.gateway_engine_name, gateway_key).",
    ).tag(config=True)
    missed_heartbeats = Int(
        3,
        min=1,
        help="Heartbeats an engine may miss (at the interval it announced) before its "
        "sandboxes are reported dead.",
    ).tag(config=True)
    connect_timeout = Float(
        10.0, min=0.1, help="Seconds to connect to an engine before it counts as unreachable."
    ).tag(config=True)
    max_request_bytes = Int(
        1024 * 1024,
        min=1024,
        help="Largest request body the gateway reads itself to place a create (others stream "
        "to their engine, which bounds them).",
    ).tag(config=True)
