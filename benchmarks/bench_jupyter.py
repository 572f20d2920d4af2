"""What the JupyterLab buttons cost, through a real Jupyter Server with the server extension.

Starts its own engine (state in a temporary directory, template from the shared cache) and a
``jupyter server`` on loopback, opens a notebook on the Sandfork kernel, makes a 200 MB NumPy
array, then times ``--runs`` times:

- *Snapshot*: ``POST sandfork/api/snapshots`` (capture + the notebook document);
- *Restore to new notebook*: ``POST .../restore`` until the new notebook's kernel printed the
  array's checksum (sandbox restored, notebook written, kernel attached, session made, first
  cell run);
- *Fork* into one branch notebook, to the branch's first result;

and, as the peer on this machine, a new notebook on a local ipykernel (``POST api/sessions``)
to its first result — which starts empty and would still have to rebuild the array.

    .venv/bin/python benchmarks/bench_jupyter.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import requests
from jupyter_client.blocking.client import BlockingKernelClient
from scratch import scratch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import clock, ms, ratio

from conftest import EngineProcess

SETUP = "import numpy as np; a = np.arange(25_000_000, dtype='float64')"  # 200 MB
CHECK = "print(int(a.sum()) % 1000)"


class Server:
    """``jupyter server`` with the Sandfork extension, driven over its REST API."""

    def __init__(self, root: Path, engine: EngineProcess) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.runtime = root / "runtime"
        env = {**os.environ, "SANDFORK_API": engine.url, "SANDFORK_API_KEY": engine.api_key}
        env["JUPYTER_RUNTIME_DIR"] = str(self.runtime)
        options = ["--allow-root", "--IdentityProvider.token=bench", f"--ServerApp.root_dir={root}"]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--port={port}", *options],
            env=env,
            stdout=(root / "server.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.http = requests.Session()
        self.http.headers["Authorization"] = "token bench"
        for _ in range(600):
            try:
                self.http.get(f"{self.url}/api/status", timeout=5).raise_for_status()
                return
            except requests.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError("jupyter server did not start")

    def call(self, method: str, path: str, body: Any = None) -> Any:
        response = self.http.request(method, f"{self.url}/{path}", json=body, timeout=600)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    def run(self, kernel_id: str, code: str) -> str:
        """Execute ``code`` on a kernel of the server; return its stdout."""
        client = BlockingKernelClient()
        client.load_connection_file(str(self.runtime / f"kernel-{kernel_id}.json"))
        client.start_channels()
        out: list[str] = []
        try:
            client.wait_for_ready(timeout=300)
            reply = client.execute_interactive(
                code,
                timeout=300,
                output_hook=lambda m: out.append(m["content"].get("text", "")),
            )
            assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            client.stop_channels()
        return "".join(out)

    def close(self) -> None:
        for session in self.call("GET", "api/sessions"):
            self.call("DELETE", f"api/sessions/{session['id']}")
        self.process.terminate()
        self.process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    root = scratch("sandfork-bench-jupyter-")
    engine = EngineProcess(root / "engine")
    (root / "engine").mkdir()
    engine.start()
    server = Server(root, engine)
    try:
        measure(server, args.runs)
    finally:
        server.close()
        engine.close()


def measure(server: Server, runs: int) -> None:
    session = server.call(
        "POST",
        "api/sessions",
        {"path": "bench.ipynb", "type": "notebook", "kernel": {"name": "sandfork"}},
    )
    kernel = session["kernel"]["id"]
    server.run(kernel, SETUP)
    expected = server.run(kernel, CHECK)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SETUP)])
    document = json.loads(nbformat.writes(nb))
    body = {"kernel_id": kernel, "path": "bench.ipynb", "notebook": document}

    snapshots, restores, forks, peers = [], [], [], []
    for _ in range(runs):
        took, snap = clock(lambda: server.call("POST", "sandfork/api/snapshots", body))
        snapshots.append(took)

        def restore(snapshot_id: str = snap["id"]) -> None:
            made = server.call("POST", f"sandfork/api/snapshots/{snapshot_id}/restore", {})
            assert server.run(made["kernel_id"], CHECK) == expected
            server.call("DELETE", f"api/sessions/{made['session']['id']}")

        restores.append(clock(restore)[0])

        def fork() -> None:
            made = server.call("POST", "sandfork/api/forks", body | {"count": 1})["branches"][0]
            assert server.run(made["kernel_id"], CHECK) == expected
            server.call("DELETE", f"api/sessions/{made['session']['id']}")

        forks.append(clock(fork)[0])
        server.call("DELETE", f"sandfork/api/snapshots/{snap['id']}")

        def peer() -> None:
            made = server.call(
                "POST",
                "api/sessions",
                {"path": "peer.ipynb", "type": "notebook", "kernel": {"name": "python3"}},
            )
            server.run(made["kernel"]["id"], "print(1)")
            server.call("DELETE", f"api/sessions/{made['id']}")

        peers.append(clock(peer)[0])

    print(f"notebook state: a 200 MB NumPy array; {runs} runs; medians")
    print(f"Snapshot (server extension)               : {ms(snapshots)}")
    print(f"Restore to new notebook, to first result  : {ms(restores)}")
    print(f"Fork into a branch notebook, first result : {ms(forks)}")
    print(f"peer: new notebook on a local ipykernel   : {ms(peers)}  (starts empty)")
    print(f"  restore vs peer: {ratio(restores, peers)}; fork vs peer: {ratio(forks, peers)}")


if __name__ == "__main__":
    main()
