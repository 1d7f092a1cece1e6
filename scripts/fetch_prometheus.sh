#!/usr/bin/env bash
# Fetch Debian's `prometheus` package (the server and promtool) into a project cache folder,
# without installing it: `apt-get download` + `dpkg-deb -x`. Nothing runs as a system service;
# the tests start the binary themselves on 127.0.0.1 with their own config and storage.
#
#   scripts/fetch_prometheus.sh [DEST]     (default: .cache/prometheus)
#
# Prints the bin folder. Idempotent: does nothing when both binaries are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.cache/prometheus}"
bin="$dest/usr/bin"
if [ -x "$bin/prometheus" ] && [ -x "$bin/promtool" ]; then
    echo "$bin"
    exit 0
fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || {
    echo "fetch_prometheus: needs apt-get and dpkg-deb (Debian/Ubuntu)" >&2
    exit 1
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
download() { (cd "$work" && apt-get download prometheus >/dev/null); }
if ! download 2>/dev/null; then
    # A fresh container has no package lists yet; refreshing them needs root.
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq >/dev/null
    else
        sudo -n apt-get update -qq >/dev/null
    fi
    download
fi
mkdir -p "$dest"
dpkg-deb -x "$work"/prometheus_*.deb "$dest"
test -x "$bin/prometheus" && test -x "$bin/promtool"
echo "$bin"
