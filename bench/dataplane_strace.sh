#!/bin/bash
# System calls per proxied small request (bench/README.md, Data plane):
#   bench/dataplane_strace.sh BUILD dp|nginx|haproxy N
# As bench/dataplane_callgrind.sh, but the proxy processes (for dp:
# osr-dataplane and osr-agent, each under its own `strace -c -f`) are counted
# with strace instead of callgrind: N keep-alive GETs over 10 connections
# (bench/dataplane_drive.py). Prints each process's total system calls and
# its top calls. Per request = (calls at N=5000 - calls at N=1000) / 4000.
# OSR_FDPASS=0 in the environment makes the agent decline descriptor
# passing (the byte tunnel through the agent, as before osr-fd).
# Needs strace, nginx, haproxy, curl.
B=$1; T=$2; N=$3
D=$(mktemp -d /tmp/osr-dpst.XXXX); mkdir -p $D/keys $D/www
BP=$((20000 + RANDOM % 10000)); PP=$((BP + 1))
cat > $D/b.conf <<EOC
user root; worker_processes 1; daemon off; master_process off; pid $D/b.pid; error_log $D/b.err warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $D/b1; proxy_temp_path $D/b2; fastcgi_temp_path $D/b3; uwsgi_temp_path $D/b4; scgi_temp_path $D/b5;
  server { listen 127.0.0.1:$BP; root $D/www; location = /hello { default_type text/plain; return 200 "hello world\n"; } } }
EOC
nginx -c $D/b.conf -p $D & NG=$!
PIDS=""
case $T in
dp)
  strace -c -f -o $D/st.agent $B/src/osr-agent --listen unix:$D/agent.sock --log-level warn 2>/dev/null & PIDS="$!"
  $B/tests/integration/dataplane/dp-mint genkey $D/keys k1 >/dev/null
  strace -c -f -o $D/st.dataplane $B/src/osr-dataplane --listen 127.0.0.1:$PP --keys-dir $D/keys --log-level warn 2>/dev/null & PIDS="$PIDS $!"
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
  server { listen 127.0.0.1:$PP; location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; } } }
EOC
  strace -c -f -o $D/st.nginx nginx -c $D/n.conf -p $D 2>/dev/null & PIDS=$!
  TOK=x; P=/hello;;
haproxy)
  printf 'global\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n  http-reuse always\nfrontend f\n  bind 127.0.0.1:%d\n  default_backend b\nbackend b\n  server s1 127.0.0.1:%d\n' $PP $BP > $D/h.cfg
  strace -c -f -o $D/st.haproxy haproxy -f $D/h.cfg 2>/dev/null & PIDS=$!
  TOK=x; P=/hello;;
esac
for i in $(seq 200); do curl -s -o /dev/null 127.0.0.1:$PP/hello && break; sleep 0.1; done
python3 "$(dirname "$0")/dataplane_drive.py" 127.0.0.1 $PP "$P" "$TOK" $N 10 >&2
# SIGINT to the traced programs (strace -c prints its table when they exit).
for p in $PIDS; do pkill -INT -P $p 2>/dev/null; done; sleep 1
for p in $PIDS; do pkill -TERM -P $p 2>/dev/null; done; wait $PIDS 2>/dev/null
kill $NG; wait $NG 2>/dev/null
for f in $D/st.*; do
  echo "$T N=$N $(basename $f) total $(awk '/^100.00/ {print $4}' $f)"
  grep -E '^ *[0-9]' $f | sort -k4 -n -r | head -6 | awk -v n="$(basename $f)" '{print "   " n, $NF, $4}'
done
rm -rf $D
