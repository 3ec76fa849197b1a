#!/usr/bin/env python3
"""Fixed-count WebSocket echo driver for bench/dataplane_strace.sh (WS=1):
one WebSocket through the proxy to the echo backend of
bench/dataplane_bench.py (--ws-backend), N 16-byte messages one at a time,
each echo checked, GAP_MS between messages. Usage: HOST PORT PATH TOKEN N [GAP_MS]
(TOKEN "x" for paths without one)."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dataplane_bench  # noqa: E402

host, port, path, tok, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
gap = float(sys.argv[6]) / 1000 if len(sys.argv) > 6 else 0
s = dataplane_bench.ws_connect(port, path, () if tok == "x" else ("X-Access-Token: " + tok,))
msg = b"0123456789abcdef"
frame = bytes([0x82, 0x80 | len(msg)]) + b"\0\0\0\0" + msg  # zero mask
want = bytes([0x82, len(msg)]) + msg
for i in range(n):
    s.sendall(frame)
    got = b""
    while len(got) < len(want):
        d = s.recv(4096)
        if not d:
            sys.exit("connection closed by the proxy")
        got += d
    if got != want:
        sys.exit("bad echo %r" % got)
    if gap:
        time.sleep(gap)
print("done %d messages" % n)
