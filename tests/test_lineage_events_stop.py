"""The Jupyter server's follower of the engine's change feed stops when the server does, even
when the cancellation of its long poll is lost on the way (Python 3.11's ``asyncio.wait_for``
can lose one that comes as the awaited call ends, gh-86296; a JupyterLab server then waited on
its extension's shutdown until it was killed)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandfork.jupyter.lineage_events import LineageEvents

pytestmark = pytest.mark.asyncio


class _EventBus:
    """Jupyter Server's event logger, as far as the follower uses it."""

    def register_event_schema(self, schema: object) -> None:
        pass

    def add_listener(self, **kwargs: Any) -> None:
        pass

    def remove_listener(self, **kwargs: Any) -> None:
        pass

    def emit(self, **kwargs: Any) -> None:
        pass


class _LosesCancellations:
    """An engine client whose long poll, when cancelled, returns as if it had been answered:
    the lost cancellation, made to happen every time."""

    def __init__(self) -> None:
        self.polls = 0
        self.polling = asyncio.Event()

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, str]:
        self.polls += 1
        self.polling.set()
        try:
            await asyncio.Event().wait()  # a long poll nothing answers
        except asyncio.CancelledError:
            pass
        return {"cursor": f"c{self.polls}"}


async def test_the_follower_stops_though_its_cancellation_is_lost() -> None:
    engine = _LosesCancellations()
    events = LineageEvents(_EventBus(), engine, kernels=None)  # type: ignore[arg-type]
    events.start()
    await engine.polling.wait()
    await asyncio.wait_for(events.stop(), 60)  # a hang's bound: it stopped for ever before
    assert engine.polls == 1
