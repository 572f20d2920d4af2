"""A client in its own process timing ``GET /v1/sandboxes`` every 100 ms (for load runs).

    python list_poller.py URL API_KEY    # stops at the first line on stdin

Prints ``status milliseconds`` for each call.
"""

from __future__ import annotations

import select
import sys
import time

import requests


def poll(url: str, api_key: str) -> None:
    """Poll until stdin has a line, then print the results."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {api_key}"
    results = []
    while not select.select([sys.stdin], [], [], 0.1)[0]:
        started = time.perf_counter()
        status = session.get(f"{url}/v1/sandboxes", timeout=60).status_code
        results.append(f"{status} {(time.perf_counter() - started) * 1000:.2f}")
    print("\n".join(results))


if __name__ == "__main__":
    poll(sys.argv[1], sys.argv[2])
