"""Snapshots in an object store: content-addressed chunks and a manifest written last.

A snapshot's files are stored page by page (:mod:`sandfork.store.pages`): pages stored before
are referenced, the others packed into chunks of at most
:data:`~sandfork.store.manifest.CHUNK_SIZE` named by their SHA-256 (``chunks/<2 hex>/<sha256>``),
so a chunk is stored once however many snapshots, chains and templates hold it; its manifest
(``manifests/<snapshot id>.json``: the files' names, kinds, sizes, modes and spans of chunks)
is written last, create-only-if-absent,
and a snapshot is durable exactly when its manifest is in the bucket. The bucket is a folder
(:class:`~sandfork.store.objects.FolderObjects`) or any S3-compatible server
(:class:`~sandfork.store.s3.S3Objects`); :class:`~sandfork.store.chunks.ChunkStore` uploads and
fetches through a bounded local cache (:class:`~sandfork.store.cache.ChunkCache`). Nothing read
from the bucket is trusted (:mod:`sandfork.store.manifest`, :mod:`sandfork.store.tree`).
"""
