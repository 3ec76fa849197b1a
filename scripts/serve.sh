#!/usr/bin/env bash
# Set up a fresh Debian 12 machine, build OSR and run it on the embedded
# default: `osr serve` on 127.0.0.1:8080 (flags are passed through, see
# `osr serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [[ ! -f build-release/build.ninja ]]; then
  meson setup build-release --buildtype=release >/dev/null
fi
ninja -C build-release >/dev/null
exec build-release/src/osr serve "$@"
