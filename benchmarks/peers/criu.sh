#!/usr/bin/env bash
# Fetches CRIU 4 for the snapshot benchmark's peer figures. Debian 12's criu 3.17 fails on
# this kernel (vDSO layout); Debian 13's 4.x works when run with its own libraries, so the
# packages are downloaded from the machine's own Debian mirror (suite trixie) and unpacked
# under ~/.cache/sandfork/peers/criu/root — nothing is installed system-wide.
set -euo pipefail
dest="${SANDFORK_CACHE_DIR:-$HOME/.cache/sandfork}/peers/criu"
[ -x "$dest/root/usr/sbin/criu" ] && exit 0
mirror=$(grep -h -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' || true)
[ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache" "$work/debs"
echo "deb $mirror trixie main" > "$work/sources.list"
: > "$work/status"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o "Dir::State::status=$work/status" -o "Dir::Cache=$work/cache")
apt-get -q "${apt_opts[@]}" update >/dev/null
packages=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances --no-pre-depends criu \
  | grep -v '^ ' | grep -E '^(criu|lib)' | sort -u)
(cd "$work/debs" && apt-get -q "${apt_opts[@]}" download $packages >/dev/null 2>&1)
mkdir -p "$dest.tmp/root"
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$dest.tmp/root"; done
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "CRIU unpacked in $dest"
