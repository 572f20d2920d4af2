"""Forks placed on other engines: when the parent's engine has no room for the copies (its
429), they start on engines that have it, from a capture of the parent that went through the
snapshot store.

The gateway asks the parent's engine for a snapshot, waits until it is ``durable`` (in the
store, so any engine of the fleet can fetch it), starts each copy where a client's restore
of it would go (:func:`~sandfork.gateway.routing.place_restore`, the same rule), then
deletes the capture from the engines that hold it (the copies keep what they use). A copy
made so is a restore of that capture: its record names no fork parent, and ``reseed_python``
is not offered (the parent's engine's 429 is the answer when it is asked for); an engine
without a snapshot store keeps its 429 too. A copy that fails to start takes the others it
started with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from http import HTTPStatus
from typing import Any

from sandfork.gateway.base import GatewayHandler
from sandfork.gateway.fleet import Engine
from sandfork.gateway.relay import engine_request, fetch, learned, start_answer
from sandfork.gateway.routing import place_restore, target
from sandfork.protocol import LimitExceeded, SandforkError, SnapshotStorage, routes

log = logging.getLogger(__name__)

UPLOAD_WAIT_S = 900.0  # bounds a capture's upload: a hang, not a speed
_POLL_S = 0.2


class ForkHandler(GatewayHandler):
    """``POST /sandboxes/{id}/fork`` and ``…/fork-tree``: the parent's engine forks, or,
    when it has no room, the copies start elsewhere (see the module's notes)."""

    async def post(self, sandbox_id: str, action: str) -> None:
        chosen = await target(self.fleet, "POST", self.request.path)
        engine = chosen.engine
        assert engine is not None  # a POST under a sandbox goes to an engine, or raises
        response = await fetch(self, engine, engine_request(self, engine, self.body_bytes()))
        if response.code == 429:
            children = await self._elsewhere(engine, sandbox_id)
            if children is not None:
                answer = {"sandbox": children[0]} if action == "fork" else {"children": children}
                self.write_json(answer, 201)
                return
        start_answer(self, response.code, response.reason, response.headers)
        learned(self, engine, chosen, response.code, response.body or b"")
        self.finish(response.body or None)

    async def _elsewhere(self, owner: Engine, sandbox_id: str) -> list[dict[str, Any]] | None:
        """The copies, started on other engines; ``None`` where that cannot be done."""
        body = self.json_body()
        count = body.get("count", 1)
        if body.get("reseed_python") or not isinstance(count, int) or count < 1:
            return None
        memory_mb = self.fleet.sandbox_memory_mb(sandbox_id)
        if not [e for e in self.fleet.candidates(memory_mb) if e is not owner]:
            return None  # nowhere else either: the owner's 429 says so
        capture = await owner.client.request(
            "POST", routes.sandbox(sandbox_id, "snapshots"), json={"name": f"fork of {sandbox_id}"}
        )
        snapshot_id = str(capture["id"])
        self.fleet.learn(owner, capture)
        try:
            if not await self._durable(owner, snapshot_id):
                return None
            return await self._copies(snapshot_id, body.get("metadata") or {}, count)
        finally:
            await self._forget(snapshot_id)

    async def _durable(self, owner: Engine, snapshot_id: str) -> bool:
        """Wait until the capture is in the store; False if it never will be."""
        deadline = time.monotonic() + UPLOAD_WAIT_S
        while time.monotonic() < deadline:
            info = await owner.client.request("GET", routes.snapshot(snapshot_id))
            storage = info.get("storage")
            if storage == SnapshotStorage.DURABLE.value:
                return True
            if storage not in (SnapshotStorage.WRITING.value, SnapshotStorage.UPLOADING.value):
                return False  # no store, or one that cannot take it: it stays local
            await asyncio.sleep(_POLL_S)
        return False

    async def _copies(
        self, snapshot_id: str, metadata: dict[str, Any], count: int
    ) -> list[dict[str, Any]]:
        made: list[tuple[Engine, dict[str, Any]]] = []
        try:
            for _ in range(count):
                made.append(await self._copy(snapshot_id, metadata))
        except BaseException:
            for engine, record in made:
                try:
                    await engine.client.request("DELETE", routes.sandbox(str(record["id"])))
                except SandforkError as e:
                    log.warning("a copy of a failed fork could not be killed: %s", e)
            raise
        return [record for _, record in made]

    async def _copy(
        self, snapshot_id: str, metadata: dict[str, Any]
    ) -> tuple[Engine, dict[str, Any]]:
        """One copy, started as a restore of the capture; its engine and its record."""

        async def start(place: Engine) -> dict[str, Any] | SandforkError:
            try:
                record: dict[str, Any] = await place.client.request(
                    "POST",
                    routes.SANDBOXES,
                    json={"from_snapshot": snapshot_id, "metadata": metadata},
                )
            except SandforkError as e:  # a refusal: place_restore decides what comes next
                return e
            return record

        placed = await place_restore(self.fleet, snapshot_id, start, _status)
        if placed is None:
            raise LimitExceeded("no engine of this gateway has room for a copy")
        place, outcome = placed
        if isinstance(outcome, SandforkError):
            raise outcome
        self.fleet.learn(place, outcome)
        return place, outcome

    async def _forget(self, snapshot_id: str) -> None:
        """Delete the capture from every engine that holds it."""
        for engine in self.fleet.snapshot_holders(snapshot_id):
            try:
                await engine.client.request("DELETE", routes.snapshot(snapshot_id))
            except SandforkError as e:
                where = engine.describe()
                log.warning("the capture %s of a fork stays on %s: %s", snapshot_id, where, e)
        self.fleet.dropped(snapshot_id)


def _status(outcome: dict[str, Any] | SandforkError) -> int:
    """The HTTP status of a copy's start: its refusal's, else a create's."""
    if isinstance(outcome, SandforkError):
        return outcome.status or HTTPStatus.INTERNAL_SERVER_ERROR
    return HTTPStatus.CREATED
