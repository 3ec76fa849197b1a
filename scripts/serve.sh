#!/usr/bin/env bash
# Set up a fresh Debian 12 machine, build OSR and run it on the embedded
# default: `osr serve` on 127.0.0.1:8080 (flags are passed through, see
# `osr serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [[ ! -f build-serve/build.ninja ]]; then
  meson setup build-serve --buildtype=release -Dtests=false >/dev/null
fi
ninja -C build-serve src/osr src/osr-agent >/dev/null
exec build-serve/src/osr serve "$@"
