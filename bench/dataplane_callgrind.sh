#!/bin/bash
# Instruction counts per proxied small request (bench/README.md, Data plane):
#   [AGENT_SECRET=1] bench/dataplane_callgrind.sh BUILD dp|nginx|haproxy N
# runs the proxy (for dp: osr-dataplane and osr-agent) under callgrind in
# front of an nginx backend, sends N keep-alive GETs over 10 connections
# (bench/dataplane_drive.py) and prints the total Ir of each proxy process.
# Per request = (Ir at N=5000 - Ir at N=1000) / 4000, which cancels start-up.
# WS=1: N 16-byte WebSocket echo messages over one upgraded connection
# instead (as bench/dataplane_strace.sh WS=1; per message likewise).
# CG_OUT=DIR keeps the callgrind files there (callgrind_annotate
# --inclusive=yes DIR/cg.PID shows where the instructions go).
# Needs valgrind, nginx, haproxy, curl.
B=$1; T=$2; N=$3
D=$(mktemp -d /tmp/osr-dpcg.XXXX); mkdir -p $D/keys $D/www
BP=$((20000 + RANDOM % 10000)); PP=$((BP + 1))
. "$(dirname "$0")/dataplane_backend.sh"
VG="valgrind --tool=callgrind --callgrind-out-file=$D/cg.%p"
PIDS=""
case $T in
dp)
  # AGENT_SECRET=1: the agent checks its derived token, as under osr serve.
  DPX=""
  if [ -n "$AGENT_SECRET" ]; then
    python3 -c 'import os; print(os.urandom(32).hex())' > $D/agent.secret
    export OSR_AGENT_TOKEN=$(python3 -c 'import hmac,hashlib,sys; print(hmac.new(bytes.fromhex(open(sys.argv[1]).read().strip()), b"s1", hashlib.sha256).hexdigest())' $D/agent.secret)
    DPX="--agent-secret-file $D/agent.secret"
  fi
  $VG $B/src/osr-agent --listen unix:$D/agent.sock --log-level warn 2>/dev/null & PIDS="$!"
  $B/tests/integration/dataplane/dp-mint genkey $D/keys k1 >/dev/null
  $VG $B/src/osr-dataplane --listen 127.0.0.1:$PP --keys-dir $D/keys --log-level warn $DPX 2>/dev/null & PIDS="$PIDS $!"
  for i in $(seq 200); do [ -S $D/agent.sock ] && curl -s -o /dev/null 127.0.0.1:$PP && break; sleep 0.2; done
  TOK=$($B/tests/integration/dataplane/dp-mint sign $D/keys k1 s1 unix:$D/agent.sock ports all 86400)
  P="/sbx/s1/$BP/hello";;
nginx)
  cat > $D/n.conf <<EOC
user root; worker_processes 1; daemon off; master_process off; pid $D/n.pid; error_log $D/n.err warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $D/n1; proxy_temp_path $D/n2; fastcgi_temp_path $D/n3; uwsgi_temp_path $D/n4; scgi_temp_path $D/n5;
  upstream b { server 127.0.0.1:$BP; keepalive 64; }
  server { listen 127.0.0.1:$PP; location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; $NGX_UPG } } }
EOC
  $VG nginx -c $D/n.conf -p $D 2>/dev/null & PIDS=$!
  TOK=x; P=/hello;;
haproxy)
  printf 'global\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n  http-reuse always\nfrontend f\n  bind 127.0.0.1:%d\n  default_backend b\nbackend b\n  server s1 127.0.0.1:%d\n' $PP $BP > $D/h.cfg
  $VG haproxy -f $D/h.cfg 2>/dev/null & PIDS=$!
  TOK=x; P=/hello;;
esac
for i in $(seq 200); do curl -s -o /dev/null 127.0.0.1:$PP/hello && break; sleep 0.2; done
if [ -n "$WS" ]; then
  python3 "$(dirname "$0")/dataplane_ws_drive.py" 127.0.0.1 $PP "${P%/hello}/ws" "$TOK" $N >&2
else
  python3 "$(dirname "$0")/dataplane_drive.py" 127.0.0.1 $PP "$P" "$TOK" $N 10 >&2
fi
for p in $PIDS; do kill -INT $p; done; sleep 1; for p in $PIDS; do kill -TERM $p 2>/dev/null; done; wait $PIDS 2>/dev/null
kill $NG; wait $NG 2>/dev/null
for f in $D/cg.*; do echo "$T N=$N $(basename $f) $(grep -m1 '^summary:' $f | awk '{print $2}') $(grep -m1 '^cmd:' $f | cut -c1-60)"; done
[ -n "$CG_OUT" ] && mkdir -p "$CG_OUT" && cp $D/cg.* "$CG_OUT"/
rm -rf $D
