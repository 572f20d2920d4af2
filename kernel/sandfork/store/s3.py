"""The object store on an S3-compatible server (AWS S3, SeaweedFS, MinIO, Ceph…).

boto3 is the client: it is the reference implementation of S3's signing and error codes, it
sends the conditional ``If-None-Match: *`` put (botocore ≥ 1.35) that a manifest needs, and it
is synchronous, which suits uploads that run in a worker thread. Credentials come from the
standard places boto3 reads (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in the
environment, a Kubernetes Secret mapped there, a profile), never from the engine's options
(:class:`~sandfork.store.config.S3Store`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import boto3
import botocore.config
import botocore.exceptions

from sandfork.store.config import S3Store
from sandfork.store.objects import ObjectMissing, StoreError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_ABSENT = {"404", "NoSuchKey", "NotFound"}
_REFUSED_CREDENTIALS = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
}


def _code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class S3Objects:
    """Objects under ``prefix`` in one bucket of an S3-compatible server."""

    def __init__(self, config: S3Store) -> None:
        if not config.bucket:
            raise StoreError("snapshot_store = s3 needs a bucket: set --S3Store.bucket")
        self.bucket = config.bucket
        self.prefix = config.prefix
        self.endpoint = config.endpoint_url or "AWS"
        self.where = f"s3://{config.bucket}/{config.prefix} on {self.endpoint}"
        # A session of its own: boto3's default one keeps the first credentials it found.
        self._client: S3Client = boto3.session.Session().client(
            "s3",
            endpoint_url=config.endpoint_url or None,
            region_name=config.region or None,
            config=botocore.config.Config(
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                s3={"addressing_style": "path"},  # S3-compatible servers rarely do virtual hosts
            ),
        )

    def _fail(self, e: Exception, what: str) -> StoreError:
        if isinstance(e, botocore.exceptions.ClientError):
            code = _code(e)
            if code == "NoSuchBucket":
                return StoreError(f"the bucket {self.bucket!r} does not exist on {self.endpoint}")
            if code in _REFUSED_CREDENTIALS:
                return StoreError(
                    f"the S3 server refused this engine's credentials ({code}) for {what} in "
                    f"{self.where}: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                )
            return StoreError(f"the S3 server refused {what} in {self.where}: {code} {e}")
        if isinstance(e, botocore.exceptions.NoCredentialsError):
            return StoreError(
                f"no S3 credentials for {self.where}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY"
            )
        return StoreError(f"the S3 server {self.endpoint} cannot be reached for {what}: {e}")

    @contextlib.contextmanager
    def _errors(self, what: str, absent: str | None = None) -> Iterator[None]:
        """Turn boto's errors into :class:`StoreError`s (``absent``: the key whose absence is
        :class:`ObjectMissing`)."""
        try:
            yield
        except botocore.exceptions.ClientError as e:
            if absent is not None and _code(e) in _ABSENT:
                raise ObjectMissing(f"no object {absent!r} in {self.where}") from None
            raise self._fail(e, what) from e
        except botocore.exceptions.BotoCoreError as e:
            raise self._fail(e, what) from e

    def check(self) -> None:
        # A listing needs the bucket and valid credentials; a HEAD would hide why it failed.
        with self._errors("a listing"):
            self._client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)

    def exists(self, key: str) -> bool:
        try:
            with self._errors(f"a lookup of {key}", absent=key):
                self._client.head_object(Bucket=self.bucket, Key=self.prefix + key)
            return True
        except ObjectMissing:
            return False

    def get(self, key: str) -> bytes:
        with self._errors(f"a read of {key}", absent=key):
            answer = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)
            return answer["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        with self._errors(f"a write of {key}"):
            self._client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            with self._errors(f"a write of {key}"):
                self._client.put_object(
                    Bucket=self.bucket, Key=self.prefix + key, Body=data, IfNoneMatch="*"
                )
            return True
        except StoreError as e:
            if isinstance(e.__cause__, botocore.exceptions.ClientError) and _code(e.__cause__) in (
                "PreconditionFailed",
                "412",
            ):
                return False  # someone wrote it first
            raise

    def keys(self, prefix: str) -> list[str]:
        found: list[str] = []
        with self._errors("a listing"):
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                found += [o["Key"][len(self.prefix) :] for o in page.get("Contents", [])]
        return sorted(found)
