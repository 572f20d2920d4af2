"""Snapshots and forks: ``/v1/sandboxes/{id}/snapshots|fork|fork-tree`` and ``/v1/snapshots``."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tornado.http1connection import HTTP1Connection

from sandfork.engine import exchange
from sandfork.engine.config import EngineConfig
from sandfork.engine.errors import BadRequest, NotFound
from sandfork.engine.handlers.base import ApiHandler, field
from sandfork.engine.handlers.validate import check_text, metadata_field, text_field
from sandfork.engine.snapshot_store import MAX_ATTACHMENT_BYTES, check_attachment_name, check_name
from sandfork.protocol import MAX_FORKS, MAX_SNAPSHOT_NAME, SandboxStatus

MAX_IMPORT_BYTES = 64 * 2**30
METADATA_PREFIX = "metadata."  # of a listing's query parameters that filter by metadata


def attachments_field(body: dict[str, Any]) -> dict[str, bytes]:
    """The optional ``attachments`` object: file names to their text (stored as UTF-8)."""
    attachments: dict[str, Any] = field(body, "attachments", dict, {})
    if not all(isinstance(v, str) for v in attachments.values()):
        raise BadRequest("attachments must map file names to text")
    try:
        return {check_attachment_name(k): v.encode() for k, v in attachments.items()}
    except UnicodeEncodeError:
        raise BadRequest("attachments must be valid Unicode text (a lone surrogate)") from None


def name_field(body: dict[str, Any]) -> str | None:
    """The optional snapshot ``name``."""
    name: str | None = text_field(body, "name", MAX_SNAPSHOT_NAME)
    return None if name is None else check_name(name)


def metadata_query(arguments: dict[str, list[bytes]], config: EngineConfig) -> dict[str, str]:
    """The ``metadata.<key>=<value>`` filters of a query: each key once, keys and values
    within the engine's metadata limits (400 otherwise)."""
    wanted: dict[str, str] = {}
    for name, values in arguments.items():
        if not name.startswith(METADATA_PREFIX):
            continue
        try:  # tornado decodes names as Latin-1, and leaves values as bytes
            key = name.removeprefix(METADATA_PREFIX).encode("latin-1").decode()
            value = values[-1].decode()
        except UnicodeError:
            raise BadRequest(f"query parameter {name[:64]!r} is not UTF-8") from None
        if not key:
            raise BadRequest(f"query parameter {name!r} names no metadata key")
        if len(values) != 1:
            raise BadRequest(f"query parameter {key[:64]!r} is given {len(values)} times")
        check_text(key, "a metadata key", config.max_metadata_key_chars)
        wanted[key] = check_text(
            value, f"metadata value of {key!r}", config.max_metadata_value_bytes
        )
    return wanted


class SandboxSnapshotsHandler(ApiHandler):
    """``POST`` snapshots a running sandbox (it keeps running); ``GET`` lists its snapshots."""

    def body_limit(self) -> int:
        # The attachments (a notebook, JSON-escaped) come in the body.
        return 2 * MAX_ATTACHMENT_BYTES + int(self.config.max_request_bytes)

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        snap = await self.snapshots.snapshot(
            sandbox_id,
            name_field(body),
            metadata=metadata_field(body, self.config),
            attachments=attachments_field(body),
        )
        self.write_json(snap.to_api(), 201)

    async def get(self, sandbox_id: str) -> None:
        self.sandboxes.get(sandbox_id)
        snaps = self.snapshots.visible(sandbox_id)
        self.write_json({"snapshots": [s.to_api() for s in snaps]})


class ForkHandler(ApiHandler):
    """``POST`` clones a running sandbox; the parent keeps running."""

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        children = await self.snapshots.fork(
            sandbox_id,
            1,
            metadata=metadata_field(body, self.config),
            reseed_python=field(body, "reseed_python", bool, False),
        )
        self.write_json({"sandbox": children[0].to_api()}, 201)


class ForkTreeHandler(ApiHandler):
    """``POST {"count": n}`` makes ``n`` (1 to :data:`~sandfork.protocol.MAX_FORKS`) children
    from one capture."""

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        count = field(body, "count", int)
        if count is None or not 1 <= count <= MAX_FORKS:
            raise BadRequest(f"count must be an integer from 1 to {MAX_FORKS}")
        children = await self.snapshots.fork(
            sandbox_id,
            count,
            metadata=metadata_field(body, self.config),
            reseed_python=field(body, "reseed_python", bool, False),
        )
        self.write_json({"children": [c.to_api() for c in children]}, 201)


class SnapshotsHandler(ApiHandler):
    """``GET`` lists snapshots, newest first; ``?sandbox_id=`` keeps one sandbox's, and each
    ``?metadata.<key>=<value>`` those whose metadata has that value (all must match)."""

    async def get(self) -> None:
        sandbox_id = self.get_query_argument("sandbox_id", None)
        wanted = metadata_query(self.request.query_arguments, self.config)
        snaps = self.snapshots.visible(sandbox_id, wanted)
        self.write_json({"snapshots": [s.to_api() for s in snaps]})


class SnapshotHandler(ApiHandler):
    """``GET`` one snapshot, ``PATCH {"name"}`` renames it, ``DELETE`` deletes it."""

    async def get(self, snapshot_id: str) -> None:
        self.write_json(self.snapshots.get(snapshot_id).to_api())

    async def patch(self, snapshot_id: str) -> None:
        name = name_field(self.json_body())
        if name is None:
            raise BadRequest("field 'name' is required")
        self.write_json(self.snapshots.rename(snapshot_id, name).to_api())

    async def delete(self, snapshot_id: str) -> None:
        self.snapshots.delete(snapshot_id)
        self.set_status(204)
        self.finish()


class AttachmentHandler(ApiHandler):
    """``GET``: a file stored with the snapshot (e.g. ``notebook.ipynb``)."""

    async def get(self, snapshot_id: str, name: str) -> None:
        data = self.snapshots.attachment(snapshot_id, name)
        self.set_header("Content-Type", "application/octet-stream")
        self.finish(data)


class CheckpointsHandler(ApiHandler):
    """``POST {"name"?}``: snapshot and mark a checkpoint in the sandbox's ledger."""

    async def post(self, sandbox_id: str) -> None:
        event = await self.snapshots.checkpoint(sandbox_id, name_field(self.json_body()))
        self.write_json(event, 201)


class ResumeHandler(ApiHandler):
    """``POST {"name"?}``: a new sandbox from the latest (or named) checkpoint, plus the
    calls before it for the client's replay cache. Works for killed sandboxes too.

    A paused sandbox (PandaStack's ``resume`` after ``pause``) goes on instead: 200, the same
    sandbox and nothing to replay.
    """

    async def post(self, sandbox_id: str) -> None:
        try:
            paused = self.sandboxes.get(sandbox_id).status is SandboxStatus.PAUSED
        except NotFound:  # killed: its checkpoints are still there
            paused = False
        if paused:
            record = await self.sandboxes.unpause(sandbox_id)
            self.write_json({"sandbox": record.to_api(), "replay": []})
            return
        record, replay = await self.snapshots.resume(sandbox_id, name_field(self.json_body()))
        self.write_json({"sandbox": record.to_api(), "replay": replay}, 201)


class LedgerHandler(ApiHandler):
    """``GET``: the sandbox's calls and checkpoint events, in order."""

    async def get(self, sandbox_id: str) -> None:
        self.write_json({"events": self.execution.ledger_events(sandbox_id)})


class ExportHandler(ApiHandler):
    """``GET``: the snapshot as one portable file (zstd tar with a checksummed manifest)."""

    async def get(self, snapshot_id: str) -> None:
        self.snapshots.get(snapshot_id)
        with tempfile.TemporaryDirectory(prefix="export-", dir=self.snapshots.tmp_dir) as tmp:
            out = Path(tmp) / f"{snapshot_id}.sfsnap"
            await self.snapshots.export_snapshot(snapshot_id, out)
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header("Content-Length", str(out.stat().st_size))
            with out.open("rb") as f:
                while chunk := f.read(1 << 20):
                    self.write(chunk)
                    await self.flush()
        self.finish()


class ImportHandler(ApiHandler):
    """``POST`` an exported snapshot file as the body; answers with the imported snapshot
    (under a new id). The file is kept in the engine's ``tmp`` folder until then."""

    _tmp: tempfile.TemporaryDirectory[str] | None = None

    def prepare(self) -> None:
        super().prepare()
        if self.refused:
            return
        if isinstance(self.request.connection, HTTP1Connection):
            self.request.connection.set_max_body_size(MAX_IMPORT_BYTES)
        self._tmp = tempfile.TemporaryDirectory(prefix="upload-", dir=self.snapshots.tmp_dir)
        self._file = (Path(self._tmp.name) / "import.sfsnap").open("wb")

    def body_chunk(self, chunk: bytes) -> None:
        self._file.write(chunk)

    async def post(self) -> None:
        self._file.close()
        try:
            snap = await self.snapshots.import_snapshot(
                Path(self._file.name), exchange.ImportLimits.of(self.config)
            )
        finally:
            self._cleanup()
        self.write_json(snap.to_api(), 201)

    def on_connection_close(self) -> None:
        self._cleanup()
        super().on_connection_close()

    def _cleanup(self) -> None:
        if self._tmp is not None:
            self._file.close()
            self._tmp.cleanup()
            self._tmp = None
