"""Throughput of a large download through a sandbox's egress channel, against the same
download made directly on the host.

The origin is an HTTP server in a network namespace of this script's own, at the end of a veth
pair (``tests/netns.py``: checked to be reached over the veth, so nothing leaves the machine);
the engine runs with ``--egress-allow`` for that one address. Run as root:

    .venv/bin/python benchmarks/bench_egress.py --mib 256 --runs 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import EngineProcess
from netns import veth_namespace
from sandfork.sdk import Sandbox

HOST, ORIGIN, PORT = "10.199.0.1", "10.199.0.2", 8765

# Runs in the guest: the download through the proxy, plain (absolute URI) or CONNECT.
GUEST = r"""
import json, os, socket, sys, time
from urllib.parse import urlsplit
mode, url = sys.argv[1], sys.argv[2]
proxy, target = urlsplit(os.environ["HTTP_PROXY"]), urlsplit(url)
s = socket.create_connection((proxy.hostname, proxy.port))
if mode == "connect":
    s.sendall(f"CONNECT {target.netloc} HTTP/1.1\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    request = f"GET {target.path} HTTP/1.1\r\nHost: {target.netloc}\r\nConnection: close\r\n\r\n"
else:
    request = f"GET {url} HTTP/1.1\r\nHost: {target.netloc}\r\n\r\n"
started = time.monotonic()
s.sendall(request.encode())
total = 0
while chunk := s.recv(1 << 20):
    total += len(chunk)
print(json.dumps({"bytes": total, "seconds": time.monotonic() - started}))
"""


def direct(url: str) -> tuple[int, float]:
    """(bytes, seconds) of the download on the host, with no proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    started = time.monotonic()
    with opener.open(url, timeout=600) as answer:
        total = 0
        while chunk := answer.read(1 << 20):
            total += len(chunk)
    return total, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the download")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sandfork-bench-egress-"))
    (work / "big").write_bytes(b"\x5a" * (args.mib << 20))
    url = f"http://{ORIGIN}:{PORT}/big"
    with veth_namespace([HOST], peer_address=ORIGIN) as veth:
        server = veth.run(
            "python3", "-m", "http.server", "--bind", ORIGIN, str(PORT), "--directory", str(work)
        )
        (work / "engine").mkdir()
        engine = EngineProcess(work / "engine", "--egress-allow", f"{ORIGIN}/32")
        try:
            while True:  # the server is up once it answers
                try:
                    direct(f"http://{ORIGIN}:{PORT}/")
                    break
                except OSError:
                    time.sleep(0.05)
            engine.start()
            sandbox = Sandbox.create(client=engine.client())
            sandbox.filesystem.write("/tmp/download.py", GUEST)
            results: dict[str, list[float]] = {"host, direct": [], "guest, GET": []}
            results["guest, CONNECT"] = []
            for _ in range(args.runs):
                size, seconds = direct(url)
                results["host, direct"].append(size / seconds / 2**20)
                for mode, name in (("get", "guest, GET"), ("connect", "guest, CONNECT")):
                    command = f"python3 /tmp/download.py {mode} {url}"
                    out = sandbox.exec(command, timeout_seconds=900)
                    got = json.loads(out.stdout)
                    assert got["bytes"] >= args.mib << 20, (out.stdout, out.stderr)
                    results[name].append(got["bytes"] / got["seconds"] / 2**20)
            sandbox.kill()
        finally:
            server.terminate()
            server.wait()
            if engine.process is not None:
                engine.close()
            shutil.rmtree(work, ignore_errors=True)
    print(f"download of {args.mib} MiB, {args.runs} runs (MiB/s: median [min-max])")
    for name, rates in results.items():
        print(f"  {name:16} {statistics.median(rates):8.1f}  [{min(rates):.1f}-{max(rates):.1f}]")


if __name__ == "__main__":
    main()
