#!/usr/bin/env bash
# Sets up a Debian 12 machine for Sandfork (as root): system packages, then a virtualenv in
# .venv with the project installed in editable mode. Safe to run again; fast when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

SYSTEM_PACKAGES=(python3-venv qemu-system-x86 qemu-utils debootstrap busybox-static e2fsprogs cpio kmod zstd)
missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "==> installing system packages: ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Downloaded wheels are kept outside the checkout so fresh clones and CI reruns install fast.
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-${SANDFORK_CACHE_DIR:-$HOME/.cache/sandfork}/pip}"
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.sandfork-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "==> installing sandfork and its test dependencies into .venv"
  .venv/bin/pip install -q -e '.[test]'
  touch "$stamp"
fi
