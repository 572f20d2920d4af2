"""The gateway: one ``/v1`` endpoint for a fleet of engines (``sandfork gateway``).

Engines register with it and send heartbeats with their capacity
(:mod:`sandfork.engine.gateway_link`); it places creates by capacity, sends what names a
sandbox or snapshot to the engine that owns it, relays everything else (REST, streams,
WebSockets) and merges the listings. It imports no engine internals: it talks to engines as
a client, over :mod:`sandfork.protocol`'s wire.

- :mod:`~sandfork.gateway.fleet`: the engines, their liveness, placement and ownership;
- :mod:`~sandfork.gateway.routing`: where a relayed request goes;
- :mod:`~sandfork.gateway.relay`: the streamed HTTP relay;
- :mod:`~sandfork.gateway.websockets`: the WebSocket relay;
- :mod:`~sandfork.gateway.fleet_handlers`: what the gateway answers itself;
- :mod:`~sandfork.gateway.server`, :mod:`~sandfork.gateway.cli`: the process.
"""
