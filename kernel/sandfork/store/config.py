"""The settings of the S3 snapshot store (``--S3Store.<name>``), apart from the client so
that reading the engine's configuration does not load boto3."""

from __future__ import annotations

from traitlets import Unicode
from traitlets.config import Configurable


class S3Store(Configurable):
    """Where the engine's snapshots go when ``EngineConfig.snapshot_store = "s3"``."""

    endpoint_url = Unicode(
        "", help="URL of the S3-compatible server, e.g. http://127.0.0.1:8333 (empty: AWS)."
    ).tag(config=True)
    bucket = Unicode("", help="The bucket that holds the chunks and manifests.").tag(config=True)
    region = Unicode("us-east-1", help="The bucket's region (what requests are signed for).").tag(
        config=True
    )
    prefix = Unicode(
        "sandfork/",
        help="Where in the bucket this fleet's objects go (several fleets may share a bucket).",
    ).tag(config=True)
