"""Engines whose snapshot store is a bucket of the test's real S3 server, and waits on a
snapshot's storage state, for the tests of snapshots that travel between engines."""

from __future__ import annotations

import time

import pytest

from s3_server import BUCKET, SeaweedS3
from sandfork.sdk import Client

HANG = 300.0  # seconds: a bound for a hang on a loaded machine, not a speed


def s3_args(s3: SeaweedS3, prefix: str, bucket: str = BUCKET) -> tuple[str, ...]:
    """``sandfork serve`` options for container sandboxes and snapshots in ``bucket``
    under ``prefix`` (its environment: ``s3.env``)."""
    return (
        "--EngineConfig.backend=container",
        "--EngineConfig.snapshot_store=s3",
        f"--S3Store.endpoint_url={s3.endpoint_url}",
        f"--S3Store.bucket={bucket}",
        f"--S3Store.prefix={prefix}",
    )


def storage(client: Client, snapshot_id: str) -> str:
    """Where the snapshot is kept: ``local``, ``uploading`` or ``durable``."""
    return str(client.request("GET", f"/snapshots/{snapshot_id}")["storage"])


def wait_for_storage(client: Client, snapshot_id: str, wanted: str) -> None:
    """Wait until the snapshot's storage is ``wanted``."""
    deadline = time.monotonic() + HANG
    while (now := storage(client, snapshot_id)) != wanted:
        assert time.monotonic() < deadline, f"{snapshot_id} stayed {now}, never {wanted}"
        time.sleep(0.1)


@pytest.fixture
def containers(template: None) -> None:
    """Skip (saying why) where container sandboxes cannot run."""
    from sandfork.backends.container.backend import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"container sandboxes cannot run here: {reason}")
