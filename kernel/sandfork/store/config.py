"""The settings of the S3 snapshot store (``--S3Store.<name>``), apart from the client so
that reading the engine's configuration does not load boto3."""

from __future__ import annotations

from traitlets import Float, Unicode
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
    signing_key = Unicode(
        "",
        help="The fleet's secret (at least 32 characters, the same on every engine of the "
        "bucket): it signs every manifest, and a manifest it did not sign is never restored. "
        "Required: whoever can write the bucket could otherwise make an engine restore a "
        "snapshot of their making (a container's is a CRIU image, restored as root).",
    ).tag(config=True)
    prefix = Unicode(
        "sandfork/",
        help="Where in the bucket this fleet's objects go (several fleets may share a bucket).",
    ).tag(config=True)
    outage_wait = Float(
        120.0,
        min=0.0,
        help="Seconds a read of a snapshot restored before it was all fetched waits, trying "
        "again, for an S3 server that cannot be reached or fails: meanwhile the sandbox stalls "
        "on the pages still to come; after that its memory cannot come and it is killed.",
    ).tag(config=True)
