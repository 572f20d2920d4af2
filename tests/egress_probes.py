"""What the egress tests run in a guest, and the secret a host server keeps from it."""

from __future__ import annotations

import json
from typing import Any

from origin import OriginServer
from sandfork.sdk import Sandbox

SECRET = "the-host-secret-4471"


class SecretServer(OriginServer):
    """An HTTP server of the host's (loopback unless told) answering :data:`SECRET`."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        super().__init__(lambda path: SECRET.encode(), address)


# Runs in the guest: each probe is a direct fetch (no proxy) or raw bytes sent to the proxy.
PROBE = r"""
import json, os, socket, sys, time, urllib.parse, urllib.request
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
results = []
for kind, target in json.loads(sys.argv[1]):
    started = time.monotonic()
    try:
        if kind == "direct":
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            out = opener.open(target, timeout=5).read().decode()
        elif kind == "env":  # whatever the environment's proxy settings say
            out = urllib.request.urlopen(target, timeout=5).read().decode()
        else:
            with socket.create_connection((proxy.hostname, proxy.port), timeout=5) as s:
                s.sendall(target.encode())
                s.shutdown(socket.SHUT_WR)
                chunks = []
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            out = b"".join(chunks).decode()
        results.append({"ok": True, "out": out})
    except Exception as e:
        results.append({"ok": False, "out": f"{type(e).__name__}: {e}"})
    results[-1]["seconds"] = time.monotonic() - started
print(json.dumps(results))
"""


def probe(sandbox: Sandbox, probes: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Run ``probes`` in the guest: each is ``{"ok", "out", "seconds"}``."""
    sandbox.filesystem.write("/tmp/probe.py", PROBE)
    result = sandbox.exec(f"python3 /tmp/probe.py '{json.dumps(probes)}'", timeout_seconds=120)
    assert result.exit_code == 0, result.stderr
    found: list[dict[str, Any]] = json.loads(result.stdout)
    return found


def proxied(url_or_authority: str) -> tuple[str, str]:
    """A probe sending a plain GET (``http://`` URL) or a CONNECT to the proxy."""
    if url_or_authority.startswith("http://"):
        host = url_or_authority.split("/")[2]
        return ("proxy", f"GET {url_or_authority} HTTP/1.1\r\nHost: {host}\r\n\r\n")
    return ("proxy", f"CONNECT {url_or_authority} HTTP/1.1\r\nHost: {url_or_authority}\r\n\r\n")
