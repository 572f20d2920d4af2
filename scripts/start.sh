#!/usr/bin/env bash
# Sets up the machine and starts the Sandfork engine in the foreground. The default template
# (code-interpreter) is built on first use with a progress display, then cached.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/sandfork doctor || true
.venv/bin/sandfork template build code-interpreter
echo "==> starting the engine; in another shell: eval \"\$(.venv/bin/sandfork env)\""
exec .venv/bin/sandfork serve "$@"
