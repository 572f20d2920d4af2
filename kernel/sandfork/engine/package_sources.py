"""The package sources of this host, which sandboxes may reach whatever they resolve to.

The egress proxy refuses every address that is not globally reachable. Where the host gets
its packages from a mirror on a private network, or through a TLS-inspecting gateway at a
reserved address, that would cut sandboxes off from ``pip install`` and ``apt-get``. So the
proxy also lets through the *names and ports* of the sources the host itself uses, whatever
address they resolve to (``EngineConfig.egress_allow_package_sources``): pip's default index
and its file host (named by pip itself, not here), the index URLs of the host's pip
configuration (what templates give their guests), and the Debian mirror the templates are
built from. A guest can reach those names on those ports and nothing else it could not
before.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

Endpoint = tuple[str, int]  # (lower-case host name, port)


def _endpoint(url: str) -> Endpoint | None:
    try:
        parts = urlsplit(url)
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname.lower(), port


def package_sources() -> frozenset[Endpoint]:
    """The (host, port) pairs of this host's package sources (what cannot be read is left
    out, with a line in the log)."""
    found: set[Endpoint] = set()
    try:  # pip's own default index and file host, as pip names them
        from pip._internal.models.index import PyPI

        found |= {(PyPI.netloc, 443), (PyPI.file_storage_domain, 443)}
    except (ImportError, AttributeError) as e:
        log.info("pip's default index is unknown (%s)", e)
    try:
        from sandfork.templates.debian import apt_mirror
        from sandfork.templates.wheels import host_index_urls

        for urls in host_index_urls().values():
            found |= {e for e in map(_endpoint, urls) if e is not None}
        mirror = _endpoint(apt_mirror("bookworm"))
        if mirror is not None:
            found.add(mirror)
    except Exception as e:  # a host without pip or apt sources: no more to add
        log.info("the host's package sources are not all known: %s", e)
    return frozenset(found)
