#!/usr/bin/env bash
# Install Debian's `chromium` for the HTML report tests (tests/load/test_report_browser.py),
# which open the reports in a real headless browser. Unlike prometheus (scripts/
# fetch_prometheus.sh, one static binary unpacked into .cache/), chromium needs its shared
# libraries, so it is installed with apt-get: as root, or with passwordless sudo.
#
#   scripts/install_chromium.sh
#
# Prints the binary's path. Idempotent: does nothing when chromium is already installed.
# Exits 1 with the reason when it cannot install (the browser tests then skip with it).
set -euo pipefail
if command -v chromium >/dev/null; then
    command -v chromium
    exit 0
fi
command -v apt-get >/dev/null || { echo "install_chromium: needs apt-get (Debian/Ubuntu)" >&2; exit 1; }
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "install_chromium: needs root or passwordless sudo for apt-get" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get install -y -qq chromium >/dev/null 2>&1 || {
    "${as_root[@]}" apt-get update -qq >/dev/null
    "${as_root[@]}" apt-get install -y -qq chromium >/dev/null
}
command -v chromium
