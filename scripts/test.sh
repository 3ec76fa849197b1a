#!/usr/bin/env bash
# Set up a fresh Debian 12 machine and run the whole OSR test suite:
#   1. install missing packages and the pinned npm test peers,
#   2. build and test with BoringSSL under ASan+UBSan (gcc),
#   3. build and test with OpenSSL 3 under ASan+UBSan,
#   4. build the fuzz targets with libFuzzer (clang) and fuzz each briefly,
# and end with one line "N passed, N failed" (counting meson tests in every
# configuration plus the fuzz runs). Exit status 0 only if nothing failed.
#
# Environment: OSR_TEST_CONFIGS="boringssl openssl fuzz" (default: all),
# OSR_FUZZ_SECONDS (default 20 per target), MESON_TEST_ARGS (extra args).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

scripts/install-deps.sh || { echo "install-deps failed"; echo "0 passed, 1 failed"; exit 1; }
if [[ -f tests/package.json ]]; then
  if [[ ! -d tests/node_modules ]] || [[ tests/package-lock.json -nt tests/node_modules ]]; then
    npm ci --prefix tests --no-audit --no-fund --loglevel=error >/dev/null || {
      echo "npm ci failed"; echo "0 passed, 1 failed"; exit 1; }
  fi
fi

configs=${OSR_TEST_CONFIGS:-"boringssl openssl fuzz"}
fuzz_seconds=${OSR_FUZZ_SECONDS:-20}
passed=0
failed=0
failures=()
faillog=$(mktemp)
trap 'rm -f "$faillog"' EXIT

count_meson() {
  # Count results from meson's JSON test log.
  local dir=$1 p f
  read -r p f < <(python3 - "$dir/meson-logs/testlog.json" "$faillog" "$dir" <<'PY'
import json, sys
p = f = 0
try:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        if r.get("result") in ("OK", "EXPECTEDFAIL", "SKIP"):
            p += 1
        else:
            f += 1
            print("FAILED: %s (%s)" % (r.get("name"), r.get("result")), file=sys.stderr)
            # Keep the failing test's own output for the end of the run,
            # where a CI summary that shows only the tail still has it.
            out = ((r.get("stdout") or "") + (r.get("stderr") or "")).splitlines()
            with open(sys.argv[2], "a") as log:
                log.write("--- %s: %s (%s), last %d of %d lines\n"
                          % (sys.argv[3], r.get("name"), r.get("result"),
                             min(len(out), 60), len(out)))
                log.write("\n".join(out[-60:]) + "\n")
except FileNotFoundError:
    f = 1
print(p, f)
PY
)
  passed=$((passed + p))
  failed=$((failed + f))
  [[ $f -eq 0 ]] || failures+=("$dir: $f failed")
}

run_config() {
  local name=$1 dir=build-test-$1; shift
  echo "=== $name: configure + build ($dir)"
  if [[ ! -f $dir/build.ninja ]]; then
    if ! meson setup "$dir" "$@" >"$dir.setup.log" 2>&1; then
      cat "$dir.setup.log"; failed=$((failed + 1)); failures+=("$name: meson setup"); return
    fi
  fi
  if ! ninja -C "$dir" >"$dir.build.log" 2>&1; then
    tail -50 "$dir.build.log"; failed=$((failed + 1)); failures+=("$name: build"); return
  fi
  echo "=== $name: meson test"
  meson test -C "$dir" --print-errorlogs --num-processes 2 ${MESON_TEST_ARGS:-} | tail -40
  count_meson "$dir"
}

san=(-Db_sanitize=address,undefined -Db_lundef=false --buildtype=debugoptimized)
for c in $configs; do
  case $c in
    boringssl) run_config boringssl -Dtls=boringssl "${san[@]}" ;;
    openssl) run_config openssl -Dtls=openssl "${san[@]}" ;;
    fuzz)
      dir=build-test-fuzz
      echo "=== fuzz: libFuzzer build ($dir)"
      if [[ ! -f $dir/build.ninja ]]; then
        CC=clang meson setup "$dir" -Dfuzzing_engine=libfuzzer -Dtests=false -Dbench=false \
          "${san[@]}" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; failed=$((failed + 1)); failures+=("fuzz: setup"); continue; }
      fi
      if ! ninja -C "$dir" >"$dir.build.log" 2>&1; then
        tail -50 "$dir.build.log"; failed=$((failed + 1)); failures+=("fuzz: build"); continue
      fi
      for exe in "$dir"/fuzz/fuzz_*; do
        [[ -x $exe && ! -d $exe ]] || continue
        t=$(basename "$exe")
        work=$(mktemp -d)
        cp -r "fuzz/corpus/$t/." "$work/" 2>/dev/null || true
        dict=(); [[ -f fuzz/$t.dict ]] && dict=(-dict="fuzz/$t.dict")
        echo "--- fuzzing $t for ${fuzz_seconds}s"
        if "$exe" "${dict[@]}" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -timeout=10 \
             -artifact_prefix="$work/" "$work" >"$work.log" 2>&1; then
          passed=$((passed + 1)); tail -1 "$work.log"
        else
          failed=$((failed + 1)); failures+=("fuzz: $t"); tail -40 "$work.log"
          ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* 2>/dev/null
        fi
        rm -rf "$work" "$work.log"
      done
      ;;
    *) echo "unknown config $c"; failed=$((failed + 1)) ;;
  esac
done

if [[ -s $faillog ]]; then
  echo "=== output of the failed tests"
  cat "$faillog"
fi
for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
