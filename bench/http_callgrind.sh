#!/bin/bash
# Instructions or system calls per HTTP/1.1 GET /hello on osr-testd
# (bench/README.md, HTTP core):
#   bench/http_callgrind.sh BUILD callgrind|strace N
# runs BUILD/tests/osr-testd under valgrind --tool=callgrind (or strace -c -f),
# sends N keep-alive GETs over 10 connections, one in flight on each
# (bench/dataplane_drive.py), and prints the total Ir (or the system-call
# table). Per request = (count at N=5000 - count at N=1000) / 4000, which
# cancels start-up and shutdown. Needs valgrind or strace, curl.
B=$1; T=$2; N=$3
D=$(mktemp -d /tmp/osr-httpcg.XXXX)
case $T in
callgrind) W="valgrind --tool=callgrind --callgrind-out-file=$D/cg.%p";;
strace) W="strace -c -f -o $D/st";;
*) echo "usage: $0 BUILD callgrind|strace N" >&2; exit 2;;
esac
$W $B/tests/osr-testd --listen 127.0.0.1:0 --log-level error > $D/out 2>/dev/null & PID=$!
for i in $(seq 300); do grep -q '^ready' $D/out 2>/dev/null && break; sleep 0.1; done
PORT=$(awk '/^listening/ {print $NF; exit}' $D/out)
python3 "$(dirname "$0")/dataplane_drive.py" 127.0.0.1 $PORT /hello x $N 10 >&2
# strace ignores SIGINT while it runs a command: signal the server itself.
SRV=$PID; [ $T = strace ] && SRV=$(pgrep -P $PID)
kill -INT $SRV; sleep 1; kill -TERM $SRV 2>/dev/null; wait $PID 2>/dev/null
case $T in
callgrind) for f in $D/cg.*; do echo "osr-testd N=$N $(grep -m1 '^summary:' $f | awk '{print $2}')"; done;;
strace) echo "osr-testd N=$N"; head -20 $D/st;;
esac
rm -rf $D
