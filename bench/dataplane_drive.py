#!/usr/bin/env python3
"""Fixed-count keep-alive driver for bench/dataplane_callgrind.sh: N small GETs
spread over C connections, one in flight per connection, answers checked
(status 200, Content-Length body read). Usage: HOST PORT PATH TOKEN N C [GAP_MS]
(TOKEN "x" for paths without one). GAP_MS: a pause after each round, so that
every request finds the proxy idle (its system calls as at a low rate)."""
import re
import socket
import sys
import time

host, port, path, tok, n, c = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
gap = float(sys.argv[7]) / 1000 if len(sys.argv) > 7 else 0
req = ("GET %s HTTP/1.1\r\nHost: x\r\nX-Access-Token: %s\r\n\r\n" % (path, tok)).encode()
socks = [socket.create_connection((host, port)) for _ in range(c)]
t = time.time(); done = 0; bad = 0
per = n // c
for s in socks:
    s.settimeout(30)
for i in range(per):
    for s in socks:
        s.sendall(req)
    for s in socks:
        buf = b""
        while True:
            d = s.recv(65536)
            if not d:
                sys.exit("connection closed by the proxy")
            buf += d
            h = buf.find(b"\r\n\r\n")
            if h >= 0:
                m = re.search(rb"content-length: *(\d+)", buf[:h], re.I)
                if m and len(buf) >= h + 4 + int(m.group(1)):
                    break
        if not buf.startswith(b"HTTP/1.1 200"):
            bad += 1
        done += 1
    if gap:
        time.sleep(gap)
print("done %d bad %d in %.1fs" % (done, bad, time.time() - t))
sys.exit(1 if bad else 0)
