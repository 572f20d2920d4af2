#!/usr/bin/env bash
# Sets up the machine and runs the whole test suite: lint, types, then pytest twice: with VM
# sandboxes (TCG or KVM), then with container sandboxes (CRIU).
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
# The slowest tests of each pass are listed at its end: where the time goes, run by run.
report=(-ra --durations=25)
# Where each test runs (docs/design-notes.md, "Where a test runs"): `portable` tests (the
# contract both backends keep) in both passes, `vm_only` ones on VMs, `any_backend` ones (they
# test what lies above the backend) once, on containers when this machine can run them.
why=$(.venv/bin/python -c 'from sandfork.backends.container.backend import unavailable; print(unavailable() or "")')
if [ -n "$why" ]; then
  echo "==> no container pass: $why; every test runs on VMs" >&2
  vm_selection=()
else
  vm_selection=(-m "not any_backend or vm_only")
fi
echo "==> pytest (sandboxes are VMs)"
set +e
SANDFORK_TEST_BACKEND=vm .venv/bin/pytest "${report[@]}" "${workers[@]}" "${vm_selection[@]}" "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
if [ -n "$why" ]; then exit "$code"; fi
echo "==> pytest (the portable and any-backend tests; sandboxes are containers)"
set +e
SANDFORK_TEST_BACKEND=container .venv/bin/pytest "${report[@]}" "${workers[@]}" \
  -m "(portable or any_backend) and not vm_only" "$@"
second=$?
set -e
if [ "$code" -ne 0 ]; then exit "$code"; fi
exit "$second"
