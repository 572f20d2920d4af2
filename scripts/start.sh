#!/usr/bin/env bash
# Sets up the machine and starts the main job: the Sandfork engine (in the background) and
# JupyterLab on it (in the foreground, on loopback). The default template (code-interpreter)
# is built on first use with a progress display, then cached. Extra arguments go to `jupyter lab`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/sandfork doctor || true
.venv/bin/sandfork template build code-interpreter
echo "==> starting JupyterLab; pick the \"Python 3 (Sandfork)\" kernel. For the SDK, in another shell: eval \"\$(.venv/bin/sandfork env)\""
exec .venv/bin/sandfork lab "$@"
