#!/bin/sh
# Instructions per create on each gateway thread (callgrind), the method of
# bench/README.md "Control plane": an osr-gateway with the in-process sim
# (latency 0), SQLite (synchronous=NORMAL) or the store URL in $STORE, the
# reaper at 1 h so its passes stay out of the numbers; WARM creates at C=10,
# counters zeroed, N measured creates at C=10, dumped; Ir per thread / N.
# SIM_URL=http://127.0.0.1:PORT uses the sim provider in url mode instead,
# against an osr-sim you started (create_bench.py's "url" cells).
#
#   bench/create_callgrind.sh BUILD_DIR [GATEWAY_BINARY]   (N=2000 WARM=200 C=10 STORE=... SIM_URL=...)
set -eu
BUILD=${1:?build dir}
GW=${2:-$BUILD/src/osr-gateway}
N=${N:-2000}
WARM=${WARM:-200}
C=${C:-10}
PORT=${PORT:-17391}
D=$(mktemp -d /tmp/osr-cg.XXXXXX)
cat > "$D/osr.yaml" <<YAML
{"providers": [{"name": "sim", "type": "sim", ${SIM_URL:+"url": "$SIM_URL", }"latency_ms": 0}],
 "reaper": {"interval_ms": 3600000}}
YAML
KEY=cg-admin-key-0123456789abcdef
OSR_ADMIN_KEY=$KEY valgrind --tool=callgrind --separate-threads=yes --compress-strings=no --compress-pos=no \
    --callgrind-out-file="$D/cg.out" "$GW" --listen 127.0.0.1:$PORT --data-dir "$D" \
    --config "$D/osr.yaml" --store "${STORE:-sqlite:$D/osr.db}" 2>"$D/gw.log" &
PID=$!
i=0
until grep -q "ready" "$D/gw.log" 2>/dev/null; do
  i=$((i + 1)); [ $i -lt 600 ] || { cat "$D/gw.log"; kill $PID; exit 1; }; sleep 0.1
done
load() {
  "$BUILD/bench/create_load" --connect 127.0.0.1:$PORT --path /v1/sandboxes \
    -H "Authorization: Bearer $KEY" --body '{"template":"base","timeoutSeconds":86400}' -c "$C" \
    --expect 201 --hard-timeout 600 "$@"
}
load -n "$WARM" >/dev/null
callgrind_control -z $PID >/dev/null
load -n "$N" >"$D/load.txt"
callgrind_control -d $PID >/dev/null
kill $PID; wait $PID 2>/dev/null || true
echo "dumps in $D (N=$N)"
for f in "$D"/cg.out.*; do
  ir=$(grep -m1 '^summary:' "$f" | awk '{print $2}')
  [ -n "$ir" ] || ir=$(grep -m1 '^totals:' "$f" | awk '{print $2}')
  th=$(grep -m1 '^thread:' "$f" | awk '{print $2}')
  echo "$f thread=$th Ir=$ir per_create=$((ir / N))"
done
