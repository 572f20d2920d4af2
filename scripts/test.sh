#!/usr/bin/env bash
# Sets up the machine and runs the whole test suite: lint, types, then pytest twice: every test
# with VM sandboxes (TCG or KVM), then the backend-independent ones with container sandboxes.
# pytest's exit code 5 (no tests collected) counts as a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> ruff"
.venv/bin/ruff check kernel tests benchmarks
.venv/bin/ruff format --check kernel tests benchmarks
echo "==> mypy"
.venv/bin/mypy
echo "==> building the default template (cached in ~/.cache/sandfork)"
.venv/bin/sandfork template build code-interpreter
if ! command -v chromium >/dev/null; then
  # The JupyterLab browser test drives Debian's Chromium with Playwright (no browser download).
  echo "==> installing chromium"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
fi
# One worker unless told (SANDFORK_TEST_WORKERS=2: pytest-xdist, a test file per worker); two
# were no faster here: a TCG VM keeps both cores busy (docs/design-notes.md, "Tests").
workers=(-n "${SANDFORK_TEST_WORKERS:-0}" --dist loadfile)
echo "==> pytest (every test; sandboxes are VMs)"
set +e
SANDFORK_TEST_BACKEND=vm .venv/bin/pytest -ra "${workers[@]}" "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
# The backend-independent tests again with container sandboxes (CRIU): the seed's two turns,
# snapshots and forks, crash points, hostile input, egress, leases, Jupyter, one browser flow.
why=$(.venv/bin/python -c 'from sandfork.backends.container.backend import unavailable; print(unavailable() or "")')
if [ -n "$why" ]; then
  echo "==> container pass skipped: $why" >&2
  exit "$code"
fi
echo "==> pytest (the portable tests; sandboxes are containers)"
set +e
SANDFORK_TEST_BACKEND=container .venv/bin/pytest -ra "${workers[@]}" -m "portable and not vm_only" "$@"
second=$?
set -e
if [ "$code" -ne 0 ]; then exit "$code"; fi
exit "$second"
