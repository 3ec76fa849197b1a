#!/bin/bash
# System calls per proxied small request (bench/README.md, Data plane):
#   bench/dataplane_strace.sh BUILD dp|nginx|haproxy N [C]
# As bench/dataplane_callgrind.sh, but the proxy processes (for dp:
# osr-dataplane and osr-agent, each under its own `strace -c -f`) are counted
# with strace instead of callgrind: N keep-alive GETs over 10 connections
# (bench/dataplane_drive.py). Prints each process's total system calls and
# its top calls. Per request = (calls at N=5000 - calls at N=1000) / 4000.
# C (default 10) is the number of keep-alive connections; C=1 sends one
# request at a time, as at a low open-loop rate where every request is alone.
# GAP_MS=M: a pause of M ms after each round of C requests, so each request
# finds the proxy idle in epoll_wait (the sequence at a low rate).
# WS=1: instead of GETs, N 16-byte WebSocket echo messages over one upgraded
# connection to the echo backend of bench/dataplane_bench.py (per message =
# (calls at N=5000 - calls at N=1000) / 4000; C is ignored).
# STRACE_T=1: instead of -c, a timed trace (strace -f -tt -T) of each process,
# printed for the last few requests (the per-request sequence).
# OSR_FDPASS=0 in the environment makes the agent decline descriptor
# passing (the byte tunnel through the agent, as before osr-fd).
# Needs strace, nginx, haproxy, curl.
B=$1; T=$2; N=$3; C=${4:-10}; GAP_MS=${GAP_MS:-0}
ST="strace -c -f"; [ -n "$STRACE_T" ] && ST="strace -f -tt -T $STRACE_X"
D=$(mktemp -d /tmp/osr-dpst.XXXX); mkdir -p $D/keys $D/www
BP=$((20000 + RANDOM % 10000)); PP=$((BP + 1))
. "$(dirname "$0")/dataplane_backend.sh"
PIDS=""
case $T in
dp)
  $ST -o $D/st.agent $B/src/osr-agent --listen unix:$D/agent.sock --log-level warn 2>/dev/null & PIDS="$!"
  $B/tests/integration/dataplane/dp-mint genkey $D/keys k1 >/dev/null
  $ST -o $D/st.dataplane $B/src/osr-dataplane --listen 127.0.0.1:$PP --keys-dir $D/keys --log-level warn 2>/dev/null & PIDS="$PIDS $!"
  for i in $(seq 200); do [ -S $D/agent.sock ] && curl -s -o /dev/null 127.0.0.1:$PP && break; sleep 0.1; done
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
  $ST -o $D/st.nginx nginx -c $D/n.conf -p $D 2>/dev/null & PIDS=$!
  TOK=x; P=/hello;;
haproxy)
  printf 'global\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n  http-reuse always\nfrontend f\n  bind 127.0.0.1:%d\n  default_backend b\nbackend b\n  server s1 127.0.0.1:%d\n' $PP $BP > $D/h.cfg
  $ST -o $D/st.haproxy haproxy -f $D/h.cfg 2>/dev/null & PIDS=$!
  TOK=x; P=/hello;;
esac
for i in $(seq 200); do curl -s -o /dev/null 127.0.0.1:$PP/hello && break; sleep 0.1; done
if [ -n "$WS" ]; then
  python3 "$(dirname "$0")/dataplane_ws_drive.py" 127.0.0.1 $PP "${P%/hello}/ws" "$TOK" $N $GAP_MS >&2
else
  python3 "$(dirname "$0")/dataplane_drive.py" 127.0.0.1 $PP "$P" "$TOK" $N $C $GAP_MS >&2
fi
# SIGINT to the traced programs (strace -c prints its table when they exit).
for p in $PIDS; do pkill -INT -P $p 2>/dev/null; done; sleep 1
for p in $PIDS; do pkill -TERM -P $p 2>/dev/null; done; wait $PIDS 2>/dev/null
kill $NG; wait $NG 2>/dev/null
for f in $D/st.*; do
  if [ -n "$STRACE_T" ]; then echo "== $(basename $f) (last 40 lines before exit)"; grep -v -E 'SIGINT|exit|rt_sig|\+\+\+|---' $f | tail -${STRACE_LINES:-48} | head -${STRACE_SHOW:-40}; continue; fi
  echo "$T N=$N $(basename $f) total $(awk '/^100.00/ {print $4}' $f)"
  grep -E '^ *[0-9]' $f | sort -k4 -n -r | head -${STRACE_TOP:-6} | awk -v n="$(basename $f)" '{print "   " n, $NF, $4}'
done
rm -rf $D
