#!/usr/bin/env bash
# Sets up the machine and runs the whole test suite: lint, types, then pytest (real VMs under
# TCG or KVM). pytest's exit code 5 (no tests collected) counts as a failure.
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
echo "==> pytest"
set +e
.venv/bin/pytest -ra "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$code"
