"""What the gateway answers for its fleet rather than relays: the engines' heartbeats, the
fleet and its health, the merged listings, the placement of a create, and the change feed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from typing import Any

from tornado.httpclient import HTTPResponse

from sandfork.gateway.base import GatewayHandler, no_engine
from sandfork.gateway.fleet import Engine, memory_of
from sandfork.gateway.relay import engine_request, fetch, learned, start_answer
from sandfork.gateway.routing import place_restore, target
from sandfork.protocol import (
    BadRequestError,
    EngineUnreachable,
    LimitExceeded,
    SandforkError,
    is_snapshot_id,
    routes,
)
from sandfork.serving import presented_key

log = logging.getLogger(__name__)

_DOWN = "down"  # an engine's place in the change cursor while it does not answer


class HeartbeatHandler(GatewayHandler):
    """``POST``: an engine registers, or says it is still there (its own key, not the
    clients')."""

    def key_is_right(self) -> bool:
        return True  # the engine's key is checked against the name it gives, below

    async def post(self) -> None:
        engine, new = self.fleet.heartbeat(presented_key(self.request), self.json_body())
        if new:
            await self.fleet.register(engine)
        self.write_json({"registered": engine.name})


def describe(handler: GatewayHandler, engine: Engine) -> dict[str, Any]:
    """One engine as the fleet's listings show it (never its key)."""
    reason = handler.fleet.down_reason(engine)
    return {
        "name": engine.name,
        "url": engine.url,
        "alive": reason is None,
        "reason": reason,
        "last_heartbeat_s": round(time.monotonic() - engine.last_seen, 3),
        "capacity": engine.capacity,
    }


class EnginesHandler(GatewayHandler):
    """``GET``: ``{"engines": [...]}``, every registered engine and whether it answers."""

    async def get(self) -> None:
        engines = [describe(self, e) for _, e in sorted(self.fleet.engines.items())]
        self.write_json({"engines": engines})


class HealthHandler(GatewayHandler):
    """``GET``: the gateway is up; the first answering engine's backend, the sandboxes
    of the answering engines, and the fleet."""

    async def get(self) -> None:
        alive = self.fleet.alive()
        first = alive[0].capacity if alive else {}
        self.write_json(
            {
                "status": "ok" if alive else "no engine",
                "gateway": True,
                "backend": first.get("backend", ""),
                "accelerator": first.get("accelerator", ""),
                "sandboxes": sum(int(e.capacity.get("sandboxes", 0)) for e in alive),
                "engines": [describe(self, e) for _, e in sorted(self.fleet.engines.items())],
            }
        )


async def _each(handler: GatewayHandler, path: str, **kwargs: Any) -> list[tuple[Engine, Any]]:
    """``GET path`` of every answering engine; one that fails now counts as down."""
    engines = handler.fleet.alive()
    answers = await asyncio.gather(
        *(e.client.request("GET", path, **kwargs) for e in engines), return_exceptions=True
    )
    found = []
    for engine, answer in zip(engines, answers, strict=True):
        if isinstance(answer, EngineUnreachable):
            handler.fleet.unreachable(engine, answer)
        elif isinstance(answer, SandforkError):
            log.warning("%s refused GET %s: %s", engine.describe(), path, answer)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            handler.fleet.learn(engine, answer)
            found.append((engine, answer))
    return found


class SandboxesHandler(GatewayHandler):
    """``GET``: every engine's sandboxes (those of a silent engine reported dead, with the
    reason); ``POST``: a create, placed by capacity, or on the snapshot's engine."""

    async def get(self) -> None:
        listed = await _each(self, routes.SANDBOXES)
        items = [item for _, answer in listed for item in answer.get("items", [])]
        for engine in self.fleet.engines.values():
            reason = self.fleet.down_reason(engine)
            if reason is not None:
                items += self.fleet.dead_records(engine, reason)
        self.write_json({"items": items})

    async def post(self) -> None:
        body = self.json_body()
        snapshot_id = body.get("from_snapshot")
        if snapshot_id not in (None, ""):
            await self._restore(snapshot_id)
            return
        needed = memory_of(body.get("memory_mb"))
        places = self.fleet.candidates(needed)
        if not places:
            free = ", ".join(
                f"{e.name}: {e.free_memory_mb()} MiB, {e.capacity.get('sandboxes', 0)} of "
                f"{e.capacity.get('max_sandboxes', 0)} sandboxes"
                for e in self.fleet.alive()
            )
            raise LimitExceeded(
                f"no engine of this gateway has room for a sandbox of {needed} MiB "
                f"({free or 'no engine answers'})"
            )
        for engine in places:
            response = await self._send(engine)
            if response.code != 429 or engine is places[-1]:
                break  # a full engine says so: the next one is tried
        if response.code < 300:
            self.fleet.placed(engine, needed)
        self._relay_answer(engine, response)

    async def _restore(self, snapshot_id: object) -> None:
        """A restore goes where the snapshot is cached if that engine has room, else to one
        with room that fetches it from the snapshot store (see :func:`place_restore`); a
        snapshot no answering engine has or can fetch is a 409 naming its silent holder."""
        if not (isinstance(snapshot_id, str) and is_snapshot_id(snapshot_id)):
            alive = self.fleet.alive()  # one engine says what is wrong, in its own words
            if not alive:
                raise no_engine()
            self._relay_answer(alive[0], await self._send(alive[0]))
            return
        placed = await place_restore(self.fleet, snapshot_id, self._send, lambda r: r.code)
        if placed is None:
            if not self.fleet.alive():
                raise no_engine()
            raise LimitExceeded(
                f"no engine of this gateway has room to restore snapshot {snapshot_id} "
                f"({self.fleet.snapshot_memory_mb(snapshot_id)} MiB)"
            )
        self._relay_answer(*placed)

    async def _send(self, engine: Engine) -> HTTPResponse:
        return await fetch(self, engine, engine_request(self, engine, self.body_bytes()))

    def _relay_answer(self, engine: Engine, response: HTTPResponse) -> None:
        start_answer(self, response.code, response.reason, response.headers)
        if response.code < 300 and response.body:
            self.fleet.learn(engine, json.loads(response.body))
        self.finish(response.body or None)


class SnapshotsHandler(GatewayHandler):
    """``GET``: the snapshots of every answering engine (the filters go to each), newest
    first; a silent engine's snapshots are not listed (those in the snapshot store restore
    elsewhere all the same)."""

    async def get(self) -> None:
        params = {k: self.get_query_argument(k) for k in self.request.query_arguments}
        listed = await _each(self, routes.SNAPSHOTS, params=params)
        # A snapshot several engines hold (fetched from the store) is listed once.
        unique = {s.get("id"): s for _, answer in listed for s in answer.get("snapshots", [])}
        snapshots = list(unique.values())
        snapshots.sort(key=lambda s: str(s.get("created_at", "")), reverse=True)
        self.write_json({"snapshots": snapshots})


class SnapshotHandler(GatewayHandler):
    """``/snapshots/{id}``: ``GET`` from an engine that holds it; ``PATCH`` (a rename) and
    ``DELETE`` on every answering engine that holds it (each engine that fetched it from the
    snapshot store holds a copy, listed as the snapshot), the first one's answer returned."""

    async def get(self, snapshot_id: str) -> None:
        await self._on_holders(snapshot_id, every=False)

    async def patch(self, snapshot_id: str) -> None:
        await self._on_holders(snapshot_id, every=True)

    async def delete(self, snapshot_id: str) -> None:
        await self._on_holders(snapshot_id, every=True)

    async def _on_holders(self, snapshot_id: str, every: bool) -> None:
        method = str(self.request.method)
        chosen = await target(self.fleet, method, self.request.path)
        assert chosen.engine is not None  # a snapshot's path goes to an engine, or raises
        engines = [chosen.engine]
        if every:
            others = self.fleet.snapshot_holders(snapshot_id)
            alive = self.fleet.alive()
            engines += [e for e in others if e is not chosen.engine and e in alive]
        body = None if method in ("GET", "DELETE") else self.body_bytes()
        answers = [(e, await fetch(self, e, engine_request(self, e, body))) for e in engines]
        for engine, response in answers:
            learned(self, engine, chosen, response.code, response.body or b"")
        if method == "DELETE" and all(r.code < 300 for _, r in answers):
            self.fleet.dropped(snapshot_id)
        engine, response = answers[0]
        start_answer(self, response.code, response.reason, response.headers)
        self.finish(response.body or None)


def _encode(cursors: dict[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(cursors, sort_keys=True).encode()).decode()


def _decode(cursor: str) -> dict[str, str]:
    try:
        cursors = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, binascii.Error):
        cursors = None
    if not isinstance(cursors, dict) or not all(isinstance(v, str) for v in cursors.values()):
        raise BadRequestError(f"not a cursor of this gateway: {cursor[:64]!r}")
    return cursors


class ChangesHandler(GatewayHandler):
    """``GET ?after=&wait=``: the fleet's change feed, a long poll like an engine's. The
    cursor holds every engine's own (or that it does not answer), so it moves when one of
    theirs does or when an engine goes down or comes back."""

    async def get(self) -> None:
        after = self.get_query_argument("after", None)
        try:
            wait = float(self.get_query_argument("wait", "25"))
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= 60:
            raise BadRequestError("wait is a number of seconds from 0 to 60")
        if after is not None:
            await self._until_moved(_decode(after), wait)
        self.write_json({"cursor": _encode(await self._cursors())})

    async def _cursors(self) -> dict[str, str]:
        cursors = {name: _DOWN for name in self.fleet.engines}
        for engine, answer in await _each(self, routes.CHANGES):
            cursors[engine.name] = str(answer.get("cursor", ""))
        return cursors

    async def _until_moved(self, after: dict[str, str], wait: float) -> None:
        alive = {e.name for e in self.fleet.alive()}
        if {n for n, c in after.items() if c != _DOWN} != alive:
            return  # an engine went down, came back or joined since
        polls = [
            asyncio.ensure_future(
                e.client.request(
                    "GET", routes.CHANGES, params={"after": after[e.name], "wait": wait}
                )
            )
            for e in self.fleet.alive()
        ]
        polls.append(asyncio.ensure_future(self.fleet.changed(wait)))
        done, pending = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            task.exception()  # retrieved: a failed poll counts as a change
