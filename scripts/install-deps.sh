#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build, test and benchmark OSR.
# Idempotent: prints nothing and touches nothing when every package is present.
#
#   scripts/install-deps.sh            build + test dependencies
#   scripts/install-deps.sh --bench    also the benchmark peers (nginx, wrk, haproxy)
set -euo pipefail

build_pkgs=(
  build-essential meson ninja-build pkg-config clang libclang-rt-14-dev
  libuv1-dev libnghttp2-dev libhiredis-dev libmsgpack-dev libsqlite3-dev
  libpq-dev libyaml-dev libjansson-dev libwslay-dev libcmocka-dev libsodium-dev
  node-llhttp android-libboringssl-dev libssl-dev
)
# Independent protocol peers the tests drive against our servers and clients.
test_pkgs=(curl nghttp2-client openssl nodejs npm python3 iproute2 procps redis-server postgresql util-linux
  bubblewrap runsc crun tar
  qemu-system-x86 busybox-static) # the cgroup v2 VM test (tests/integration/local/vm_cgroup2.py)
bench_pkgs=(nginx-light libnginx-mod-http-echo wrk haproxy hyperfine)

want=("${build_pkgs[@]}" "${test_pkgs[@]}")
if [[ "${1:-}" == "--bench" ]]; then
  want+=("${bench_pkgs[@]}")
fi

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# node/npm may come from outside Debian's packages on some machines; accept them.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=()
  for p in "${missing[@]}"; do
    [[ "$p" == nodejs || "$p" == npm ]] || tmp+=("$p")
  done
  missing=("${tmp[@]}")
fi
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
