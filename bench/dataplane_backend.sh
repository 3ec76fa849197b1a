# Sourced by bench/dataplane_callgrind.sh and bench/dataplane_strace.sh with
# D (a fresh directory) and BP (the backend port) set: starts the backend on
# 127.0.0.1:$BP (nginx serving /hello, or with WS=1 the WebSocket echo server
# of bench/dataplane_bench.py), its pid in NG, and sets NGX_UPG to the
# proxy_pass lines the nginx proxy needs for an upgrade (empty without WS).
cat > $D/b.conf <<EOC
user root; worker_processes 1; daemon off; master_process off; pid $D/b.pid; error_log $D/b.err warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $D/b1; proxy_temp_path $D/b2; fastcgi_temp_path $D/b3; uwsgi_temp_path $D/b4; scgi_temp_path $D/b5;
  server { listen 127.0.0.1:$BP; root $D/www; location = /hello { default_type text/plain; return 200 "hello world\n"; } } }
EOC
if [ -n "$WS" ]; then  # the echo backend in place of nginx's /hello
  python3 "$(dirname "$0")/dataplane_bench.py" --ws-backend $BP & NG=$!
  sleep 0.5
else
  nginx -c $D/b.conf -p $D & NG=$!
fi
NGX_UPG=""; [ -n "$WS" ] && NGX_UPG='proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection "upgrade";'
