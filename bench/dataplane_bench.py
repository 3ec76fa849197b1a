#!/usr/bin/env python3
"""Data plane benchmark (issue 5): the same backend through five paths, side by side.

  direct      client -> backend
  dataplane   -> osr-dataplane -> backend, on the socket osr-agent connected
              and passed over its unix socket (osr-fd, docs/agent.md): the
              agent is out of the data path
  dp-copy     the same with OSR_SPLICE=0 (no splice(2): every relay on the
              copy path), to show what splice(2) brings
  dp-tunnel   -> osr-dataplane -> osr-agent port tunnel (unix socket) ->
              backend, the agent declining descriptor passing (OSR_FDPASS=0):
              the path before osr-fd, and what gVisor sandboxes still take
  nginx       -> nginx (proxy_pass, upstream keepalive, WebSocket upgrade) -> backend
  haproxy     -> haproxy (mode http, http-reuse always) -> backend
  dp-b        with --build-b DIR: "dataplane" from a second OSR build, for an
              interleaved A/B of two builds in the same rounds
  splice-relay  (--only-big, asked for by name) bench/splice_relay: two
              blocking splice(2) threads per connection and nothing else, the
              floor of any user-space proxy in this layout

Backends: nginx serving /hello (12 bytes) and /big (1 GiB), and a small
asyncio WebSocket echo server (bench/dataplane_bench.py --ws-backend).
Proxies, agent and backends are pinned to --server-cpu with one worker
each, every load generator to --client-cpu; rounds are interleaved (every
path once per round, in rotating order) and medians are reported.

Rows, per path:
  req/s        wrk closed loop (--conns connections, --duration s)
  CPU us/req   user+system CPU of the proxy processes during that wrk run
               (osr-dataplane + osr-agent for the OSR paths) / requests
  p50/p99/p99.9 at a fixed --rate req/s, open loop (bench/openloop.c),
               minus direct
  1 GiB        curl download, MB/s and x direct
  WS echo      p50 round trip of a 16-byte WebSocket message, minus direct
  RSS          VmRSS growth of the proxy processes / N for N idle HTTP
               keep-alive connections and N idle WebSockets (--idle N)
  exec stdout  1 GiB of `head -c` stdout from osr-agent (the dataplane
               path's agent): direct on its socket, through nginx, haproxy
               and osr-dataplane (envd route, JSON and proto; the exec
               console), the bare pipe as a ceiling (exec_row below)

Usage: bench/dataplane_bench.py [--build DIR] [--rounds N] [--duration S]
            [--conns N] [--rate R] [--idle N] [--paths a,b] [--no-big] [--only-big]
            [--only-exec] [--exec-rounds N] [--exec-bytes B] [--exec-codecs json,proto]
            [--exec-paths A,B] [--build-b DIR]
  --only-big   the 1 GiB download row alone, with the CPU s/GiB of the proxy,
               the backend nginx (on the proxy's CPU) and curl, and the
               proxy's context switches per GiB
  --only-exec  the 1 GiB exec stdout row alone: the agent's Connect stream
               read directly, through nginx, haproxy, bench/splice_relay (the
               floor) and osr-dataplane (envd route and exec console), and the
               bare pipe as a ceiling; the CPU s/GiB of the agent (with its
               child `head`) and of the proxy (bench/exec_read reads all);
               with --build-b also "dp-b proto|json|console" (the second
               build's data plane and agent)
  --exec-paths the exec row's paths to run, by name or first word
  --only-latency  the open-loop and WebSocket echo rows alone (no wrk, 1 GiB
               or idle rows): with --build-b and many --rounds, the A/B of
               the added latency
Needs: wrk, curl, nginx, haproxy, taskset; the build's osr-dataplane,
osr-agent, dp-mint, bench/openloop, bench/exec_read and bench/splice_relay.
"""
import argparse
import asyncio
import base64
import hashlib
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import services  # noqa: E402

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

BACKEND = """user root; worker_processes 1; daemon off; master_process off; pid {d}/b.pid;
error_log {d}/b.err warn; worker_rlimit_nofile 20000;
events {{ worker_connections 19000; }}
http {{ access_log off; sendfile on; keepalive_requests 100000000; keepalive_timeout 600s;
  client_body_temp_path {d}/b1; proxy_temp_path {d}/b2; fastcgi_temp_path {d}/b3;
  uwsgi_temp_path {d}/b4; scgi_temp_path {d}/b5;
  server {{ listen 127.0.0.1:{port}; root {d}/www;
    location = /hello {{ default_type text/plain; return 200 "hello world\\n"; }} }} }}
"""
NGINX = """user root; worker_processes 1; daemon off; master_process off; pid {d}/n.pid;
error_log {d}/n.err warn; worker_rlimit_nofile 20000;
events {{ worker_connections 19000; }}
http {{ access_log off; keepalive_requests 100000000; keepalive_timeout 600s;
  client_body_temp_path {d}/n1; proxy_temp_path {d}/n2; fastcgi_temp_path {d}/n3;
  uwsgi_temp_path {d}/n4; scgi_temp_path {d}/n5;
  map $http_upgrade $conn {{ default upgrade; '' ''; }}
  upstream b {{ server 127.0.0.1:{bport}; keepalive 64; }}
  upstream w {{ server 127.0.0.1:{wport}; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_buffering off; }}
    location /ws {{ proxy_pass http://w; proxy_http_version 1.1; proxy_buffering off;
                   proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection $conn;
                   proxy_read_timeout 600s; }} }} }}
"""
HAPROXY = """global
  nbthread 1
  maxconn 9900
defaults
  mode http
  maxconn 9900
  timeout connect 5s
  timeout client 600s
  timeout server 600s
  timeout tunnel 600s
  http-reuse always
frontend f
  bind 127.0.0.1:{port}
  use_backend w if {{ path_beg /ws }}
  default_backend b
backend b
  server s1 127.0.0.1:{bport}
backend w
  server s1 127.0.0.1:{wport}
"""


# ---- WebSocket echo backend (run as a child: --ws-backend PORT) ----------------

async def ws_serve(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        key = re.search(rb"(?i)sec-websocket-key:\s*(\S+)", head).group(1)
        acc = base64.b64encode(hashlib.sha1(key + WS_GUID.encode()).digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
        while True:
            h = await reader.readexactly(2)
            n = h[1] & 0x7F
            if n == 126:
                n = struct.unpack("!H", await reader.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", await reader.readexactly(8))[0]
            mask = await reader.readexactly(4) if h[1] & 0x80 else b"\0\0\0\0"
            data = bytearray(await reader.readexactly(n))
            for i in range(n):
                data[i] ^= mask[i % 4]
            if h[0] & 0x0F == 8:
                break
            writer.write(bytes([h[0], n]) + bytes(data) if n < 126 else
                         bytes([h[0], 126]) + struct.pack("!H", n) + bytes(data))
    except (asyncio.IncompleteReadError, ConnectionError, AttributeError):
        pass
    writer.close()


def ws_backend(port):
    async def main():
        srv = await asyncio.start_server(ws_serve, "127.0.0.1", port, backlog=4096)
        async with srv:
            await srv.serve_forever()
    asyncio.run(main())


def ws_connect(port, path, headers=()):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    key = base64.b64encode(os.urandom(16)).decode()
    req = "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" \
          "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n" % (path, port, key)
    for h in headers:
        req += h + "\r\n"
    s.sendall((req + "\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            raise RuntimeError("websocket handshake: connection closed")
        buf += d
    if not buf.startswith(b"HTTP/1.1 101"):
        raise RuntimeError("websocket handshake: " + buf[:40].decode(errors="replace"))
    return s


def ws_echo_p50(port, path, headers, n):
    s = ws_connect(port, path, headers)
    msg = b"0123456789abcdef"
    frame = bytes([0x82, 0x80 | len(msg)]) + b"\0\0\0\0" + msg  # zero mask
    lat = []
    for i in range(n):
        t = time.perf_counter()
        s.sendall(frame)
        got = b""
        while len(got) < 2 + len(msg):
            got += s.recv(4096)
        lat.append(time.perf_counter() - t)
    s.close()
    lat.sort()
    return lat[len(lat) // 2] * 1e6


# ---- 1 GiB exec stdout: one agent stream, six ways to read it -------------------

# The backend of an exec stream is osr-agent: "direct" reads the process's
# stdout from the agent's own socket (Connect process.Process/Start server
# stream), nginx and haproxy proxy that same stream (HTTP/1.1, unbuffered),
# osr-dataplane carries it on its envd route (/sbx/ID/49983/...) and as its
# Kubernetes exec console (WebSocket v5.channel.k8s.io, binary upstream).
# Every path is read by bench/exec_read (C, one 4 MiB read buffer, payload
# skipped in place), so the reader costs the same everywhere.
EXEC_NGINX = """user root; worker_processes 1; daemon off; master_process off; pid {d}/en.pid;
error_log {d}/en.err warn; events {{ worker_connections 1024; }}
http {{ access_log off; keepalive_timeout 600s;
  client_body_temp_path {d}/en1; proxy_temp_path {d}/en2; fastcgi_temp_path {d}/en3;
  uwsgi_temp_path {d}/en4; scgi_temp_path {d}/en5;
  upstream a {{ server unix:{sock}; keepalive 8; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://a; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_buffering off; proxy_request_buffering off; proxy_read_timeout 600s; }} }} }}
"""
EXEC_HAPROXY = """global
  nbthread 1
defaults
  mode http
  timeout connect 5s
  timeout client 600s
  timeout server 600s
frontend e
  bind 127.0.0.1:{port}
  default_backend a
backend a
  server a1 unix@{sock}
"""
EXEC_PIPE = "pipe (ceiling: no agent)"


def exec_read(exe, cpu, args):
    """MB/s of one bench/exec_read run pinned to cpu (it checks the byte count
    and the success status itself)."""
    out = subprocess.run(["taskset", "-c", str(cpu), exe] + [str(x) for x in args],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError("exec_read %s: %s %s" % (args[0], out.stdout.strip(), out.stderr.strip()))
    return float(out.stdout.split()[5])


def pipe_stdout(exe, server_cpu, client_cpu, nbytes):
    """MB/s of `head -c nbytes /dev/zero` (on server_cpu, where the agent's
    children run) read straight from its stdout pipe: the ceiling."""
    head = subprocess.Popen(["taskset", "-c", str(server_cpu), "head", "-c", str(nbytes),
                             "/dev/zero"], stdout=subprocess.PIPE)
    try:
        out = subprocess.run(["taskset", "-c", str(client_cpu), exe, "pipe", str(nbytes)],
                             stdin=head.stdout, capture_output=True, text=True, timeout=900)
    finally:
        head.stdout.close()
        head.wait()
    if out.returncode != 0:
        raise RuntimeError("exec_read pipe: " + out.stderr.strip())
    return float(out.stdout.split()[5])


def exec_cmd_query(nbytes):
    return ("command=head&command=-c&command=%d&command=/dev/zero&stdout=true&stderr=false"
            % nbytes)


def ctx_switches(pid):
    """Voluntary + involuntary context switches of pid so far."""
    with open("/proc/%d/status" % pid) as f:
        t = f.read()
    return sum(int(x) for x in re.findall(r"(?m)^(?:non)?voluntary_ctxt_switches:\s+(\d+)", t))


def exec_tok(mint, d, sock):
    """An exec-scope token for the agent listening on sock."""
    return subprocess.run([mint, "sign", os.path.join(d, "keys"), "k1", "s1",
                           "unix:" + sock, "exec", "none", "86400"],
                          capture_output=True, text=True, check=True).stdout.strip()


def exec_row(a, d, osr, mint, procs):
    """The 1 GiB exec stdout row: every path once per round in rotating
    order; MB/s, and the CPU the agent (with `head`, its child) and the
    proxy spent per GiB. With --build-b, "dp-b proto" and "dp-b console" are
    the same paths through the second build's data plane and agent."""
    exe = os.path.join(a.build, "bench", "exec_read")
    dport, sock, (dp_pid, agent_pid) = osr["dataplane"]
    tok = exec_tok(mint, d, sock)
    nb = a.exec_bytes
    enport, ehport = services.free_port(), services.free_port()
    path = os.path.join(d, "exec-nginx.conf")
    with open(path, "w") as f:
        f.write(EXEC_NGINX.format(d=d, port=enport, sock=sock))
    procs.append(pinned(a.server_cpu, ["nginx", "-c", path, "-p", d]))
    en_pid = procs[-1].pid
    path = os.path.join(d, "exec-haproxy.cfg")
    with open(path, "w") as f:
        f.write(EXEC_HAPROXY.format(port=ehport, sock=sock))
    procs.append(pinned(a.server_cpu, ["haproxy", "-f", path]))
    eh_pid = procs[-1].pid
    rport = services.free_port()  # bench/splice_relay: the floor of any proxy
    procs.append(pinned(a.server_cpu, [os.path.join(a.build, "bench", "splice_relay"),
                                       str(rport), "unix:" + sock]))
    rl_pid = procs[-1].pid
    services._wait_port(enport)
    services._wait_port(ehport)
    services._wait_port(rport)
    hdr = "X-Access-Token: " + tok
    # name -> (exec_read arguments, proxy pid or None, agent pid)
    paths = {EXEC_PIPE: (None, None, agent_pid)}
    for codec in a.exec_codecs.split(","):
        paths["direct " + codec] = (["connect", "unix:" + sock, "", codec, nb], None, agent_pid)
        paths["nginx " + codec] = (["connect", "127.0.0.1:%d" % enport, "", codec, nb], en_pid,
                                   agent_pid)
        paths["haproxy " + codec] = (["connect", "127.0.0.1:%d" % ehport, "", codec, nb], eh_pid,
                                     agent_pid)
        paths["dataplane " + codec] = (["connect", "127.0.0.1:%d" % dport,
                                        "/sbx/s1/%d" % 49983, codec, nb, hdr], dp_pid, agent_pid)
        paths["splice-relay " + codec] = (["connect", "127.0.0.1:%d" % rport, "", codec, nb],
                                          rl_pid, agent_pid)
    paths["dataplane console"] = (["ws", "127.0.0.1:%d" % dport, "/v1/sandboxes/s1/exec?"
                                   + exec_cmd_query(nb), nb, hdr], dp_pid, agent_pid)
    if "dp-b" in osr:  # --build-b: the other build's data plane and agent
        bport, bsock, (bdp, bag) = osr["dp-b"]
        bhdr = "X-Access-Token: " + exec_tok(mint, d, bsock)
        for codec in a.exec_codecs.split(","):
            paths["dp-b " + codec] = (["connect", "127.0.0.1:%d" % bport, "/sbx/s1/%d" % 49983,
                                       codec, nb, bhdr], bdp, bag)
        paths["dp-b console"] = (["ws", "127.0.0.1:%d" % bport, "/v1/sandboxes/s1/exec?"
                                  + exec_cmd_query(nb), nb, bhdr], bdp, bag)
    if a.exec_paths:  # a subset, by name ("dataplane proto,haproxy proto")
        want = a.exec_paths.split(",")
        paths = {k: v for k, v in paths.items() if k in want or k.split()[0] in want}
    names = list(paths)
    res = {k: ([], [], [], []) for k in names}
    print("exec row: load average %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    for r in range(a.exec_rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            args, ppid, apid = paths[name]
            pids = [apid] + ([ppid] if ppid else [])
            c0 = (cpu_s([apid], children=True), cpu_s([ppid]) if ppid else 0,
                  sum(ctx_switches(p) for p in pids))
            mbs = (pipe_stdout(exe, a.server_cpu, a.client_cpu, nb) if args is None
                   else exec_read(exe, a.client_cpu, args))
            c1 = (cpu_s([apid], children=True), cpu_s([ppid]) if ppid else 0,
                  sum(ctx_switches(p) for p in pids))
            gib = nb / (1 << 30)
            res[name][0].append(mbs)
            res[name][1].append((c1[0] - c0[0]) / gib)
            res[name][2].append((c1[1] - c0[1]) / gib)
            res[name][3].append((c1[2] - c0[2]) / gib)
            print("exec round %d %-24s %6.0f MB/s, CPU s/GiB agent %.2f proxy %.2f, "
                  "context switches/GiB agent+proxy %.0f" % (r + 1, name, mbs, res[name][1][-1],
                                                             res[name][2][-1], res[name][3][-1]),
                  flush=True)
    print("exec row: load average %.2f %.2f %.2f\n" % os.getloadavg())
    med = {k: statistics.median(v[0]) for k, v in res.items()}
    print("| 1 GiB exec stdout | MB/s | × direct (same codec) | × better proxy (same codec) "
          "| × pipe | agent + head CPU s/GiB | proxy CPU s/GiB | switches/GiB agent+proxy |")
    print("|---|---|---|---|---|---|---|---|")
    for k, (mbs, acpu, pcpu, sw) in res.items():
        codec = k.split()[-1] if k.split()[-1] in ("json", "proto") else "proto"
        dr = med.get("direct " + codec)
        prox = [med[p + " " + codec] for p in ("nginx", "haproxy") if p + " " + codec in med]
        is_pipe = k == EXEC_PIPE
        print("| %s | %.0f | %s | %s | %s | %s | %s | %s |" % (
            k, med[k], "-" if is_pipe or not dr else "%.2f" % (med[k] / dr),
            "%.2f" % (med[k] / max(prox)) if k.startswith(("dataplane", "dp-b")) and prox else "-",
            "%.2f" % (med[k] / med[EXEC_PIPE]) if EXEC_PIPE in med else "-",
            "-" if is_pipe else "%.2f" % statistics.median(acpu),
            "%.2f" % statistics.median(pcpu) if paths[k][1] else "-",
            "-" if is_pipe else "%.0f" % statistics.median(sw)))
    print("\n(the console row's upstream is the proto stream: its x direct is against direct proto)")
    print()


# ---- helpers --------------------------------------------------------------------

def pinned(cpu, args, env=None):
    return subprocess.Popen(["taskset", "-c", str(cpu)] + args, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)


def traced_child(pid):
    """The process strace (pid) started."""
    for _ in range(200):
        try:
            with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("strace started nothing")


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def child_cpu_s():
    """User + system CPU of this script's waited-for children so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def cpu_s(pids, children=False):
    """User + system CPU seconds of pids so far (with children: plus that of
    their reaped children, e.g. the agent's `head`)."""
    t = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        t += int(fields[11]) + int(fields[12])  # utime, stime
        if children:
            t += int(fields[13]) + int(fields[14])  # cutime, cstime
    return t / os.sysconf("SC_CLK_TCK")


def ctxsw(pids):
    """Voluntary and involuntary context switches of pids so far."""
    v = n = 0
    for pid in pids:
        with open("/proc/%d/status" % pid) as f:
            t = f.read()
        v += int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", t).group(1))
        n += int(re.search(r"nonvoluntary_ctxt_switches:\s+(\d+)", t).group(1))
    return v, n


def rss_kib(pids):
    t = 0
    for pid in pids:
        with open("/proc/%d/status" % pid) as f:
            t += int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
    return t


def wrk(cpu, url, duration, conns, headers=()):
    args = ["taskset", "-c", str(cpu), "wrk", "-t1", "-c%d" % conns, "-d%ds" % duration]
    for h in headers:
        args += ["-H", h]
    out = subprocess.run(args + [url], capture_output=True, text=True, timeout=duration + 60).stdout
    m = re.search(r"(\d+) requests in", out)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), int(m.group(1))


def openloop(exe, cpu, port, path, rate, secs, headers=()):
    out = subprocess.run(["taskset", "-c", str(cpu), exe, "127.0.0.1", str(port), path, str(rate),
                          str(secs), "50"] + list(headers), capture_output=True, text=True,
                         timeout=secs + 60).stdout
    m = re.search(r"errors (\d+) measured \d+ p50 (\d+) p99 (\d+) p999 (\d+)", out)
    if m is None:
        raise RuntimeError("openloop: " + out)
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))


def download(cpu, url, headers=()):
    args = ["taskset", "-c", str(cpu), "curl", "-sS", "--fail", "-o", "/dev/null", "-w",
            "%{speed_download} %{size_download}"]
    for h in headers:
        args += ["-H", h]
    out = subprocess.run(args + [url], capture_output=True, text=True, timeout=600,
                         check=True).stdout.split()
    if int(out[1]) != 1 << 30:
        raise RuntimeError("short download: %s bytes" % out[1])
    return float(out[0]) / 1e6  # MB/s


def big_only(a, names, paths, prefix, bport, backend_pid):
    """--only-big: the download row, every path once per round in rotating
    order, with the user+system CPU per GiB (a load-independent view of the
    same transfer) of the proxy processes, of the backend nginx (on the
    proxy's CPU: what it costs to feed the proxy counts against the row) and
    of curl, and the proxy's context switches per GiB."""
    res = {k: ([], [], [], [], []) for k in names}
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            port, _, hdr, pids = paths[name]
            c0, b0, k0, x0 = cpu_s(pids), cpu_s([backend_pid]), child_cpu_s(), sum(ctxsw(pids))
            big = download(a.client_cpu, "http://127.0.0.1:%d%s/big" % (port, prefix(name, bport)),
                           hdr)
            cpu, bcpu = cpu_s(pids) - c0, cpu_s([backend_pid]) - b0
            kcpu, sw = child_cpu_s() - k0, sum(ctxsw(pids)) - x0
            for i, v in enumerate((big, cpu, bcpu, kcpu, sw)):
                res[name][i].append(v)
            print("round %d %-9s 1 GiB %5.0f MB/s, CPU s proxy %.2f backend %.2f curl %.2f, "
                  "proxy switches %d" % (r + 1, name, big, cpu, bcpu, kcpu, sw), flush=True)
    print("\nload average: %.2f %.2f %.2f\n" % os.getloadavg())
    print("| path | 1 GiB MB/s | × direct | proxy CPU s/GiB | backend CPU s/GiB | curl CPU s/GiB "
          "| proxy switches/GiB |")
    print("|---|---|---|---|---|---|---|")
    dr = statistics.median(res["direct"][0]) if "direct" in res else None
    for k, (mbs, cpu, bcpu, kcpu, sw) in res.items():
        m = statistics.median(mbs)
        px = bool(paths[k][3])
        print("| %s | %.0f | %s | %s | %.2f | %.2f | %s |" % (
            k, m, "%.2f" % (m / dr) if dr else "-", "%.2f" % statistics.median(cpu) if px else "-",
            statistics.median(bcpu), statistics.median(kcpu),
            "%.0f" % statistics.median(sw) if px else "-"))


def idle_http(port, path, headers, n):
    req = ("GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (path, "".join(h + "\r\n" for h in headers)))
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(req.encode())
        buf = b""
        while not buf.endswith(b"hello world\n"):
            d = s.recv(4096)
            if not d:
                raise RuntimeError("idle http: closed")
            buf += d
        socks.append(s)
    return socks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--rate-secs", type=int, default=10)
    ap.add_argument("--idle", type=int, default=4900)
    ap.add_argument("--ws-n", type=int, default=2000)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--paths", default="direct,dataplane,dp-copy,dp-tunnel,nginx,haproxy")
    ap.add_argument("--no-big", action="store_true")
    ap.add_argument("--strace", metavar="DIR",
                    help="run each osr-dataplane under strace -c -f, summaries to DIR/<path>.strace")
    ap.add_argument("--only-big", action="store_true",
                    help="the 1 GiB download row alone (with the proxies' CPU per GiB)")
    ap.add_argument("--build-b", metavar="DIR",
                    help="a second OSR build, run as path dp-b (as dataplane) in the same rounds")
    ap.add_argument("--only-latency", action="store_true",
                    help="the open-loop and WebSocket echo rows alone")
    ap.add_argument("--exec-rounds", type=int, default=3,
                    help="1 GiB exec stdout rounds (0: skip)")
    ap.add_argument("--exec-bytes", type=int, default=1 << 30, help="bytes of each exec stdout")
    ap.add_argument("--exec-codecs", default="json,proto",
                    help="Connect codecs of the exec row's agent-stream paths")
    ap.add_argument("--exec-paths", metavar="A,B",
                    help="the exec row's paths to run, by name or first word (pipe, direct, "
                         "nginx, haproxy, dataplane, dp-b, 'dataplane console', 'haproxy proto')")
    ap.add_argument("--only-exec", action="store_true",
                    help="the 1 GiB exec stdout row alone (needs the dataplane path)")
    ap.add_argument("--ws-backend", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    # SIGTERM (a stopped run) unwinds like an error: the finally below stops
    # every process this run started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.ws_backend:
        return ws_backend(a.ws_backend)
    for tool in ("wrk", "curl", "nginx", "haproxy", "taskset"):
        if shutil.which(tool) is None:
            sys.exit("missing %s" % tool)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    try:  # children inherit it; root may raise the hard limit too
        resource.setrlimit(resource.RLIMIT_NOFILE, (65536, max(hard, 65536)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 3 * a.idle + 1000:
        sys.exit("ulimit -n too low for --idle %d" % a.idle)
    dpexe = os.path.join(a.build, "src", "osr-dataplane")
    agent = os.path.join(a.build, "src", "osr-agent")
    mint = os.path.join(a.build, "tests", "integration", "dataplane", "dp-mint")
    olexe = os.path.join(a.build, "bench", "openloop")
    want = a.paths.split(",")
    if a.build_b and "dp-b" not in want:
        want.append("dp-b")
    if a.only_latency:
        a.no_big, a.exec_rounds = True, 0
    d = tempfile.mkdtemp(prefix="osr-dpbench-")
    procs = []
    traced = []
    try:
        os.mkdir(os.path.join(d, "www"))
        os.mkdir(os.path.join(d, "keys"))
        if not a.no_big:
            with open(os.path.join(d, "www", "big"), "wb") as f:
                chunk = os.urandom(1 << 20)
                for _ in range(1024):
                    f.write(chunk)
        bport, wport, nport, hport, dport, cport, tport = (services.free_port() for _ in range(7))
        for name, conf, port in (("backend", BACKEND, bport), ("nginx", NGINX, nport)):
            path = os.path.join(d, name + ".conf")
            with open(path, "w") as f:
                f.write(conf.format(d=d, port=port, bport=bport, wport=wport))
            procs.append(pinned(a.server_cpu, ["nginx", "-c", path, "-p", d]))
        nginx_pid = procs[-1].pid
        path = os.path.join(d, "haproxy.cfg")
        with open(path, "w") as f:
            f.write(HAPROXY.format(port=hport, bport=bport, wport=wport))
        procs.append(pinned(a.server_cpu, ["haproxy", "-f", path]))
        haproxy_pid = procs[-1].pid
        procs.append(pinned(a.server_cpu, [sys.executable, __file__, "--ws-backend", str(wport)]))
        subprocess.run([mint, "genkey", os.path.join(d, "keys"), "k1"], check=True,
                       stdout=subprocess.DEVNULL)
        osr = {}
        builds = {"dp-b": a.build_b}
        for name, port, splice, fdpass in (("dataplane", dport, "1", "1"), ("dp-copy", cport, "0", "1"),
                                           ("dp-tunnel", tport, "1", "0"),
                                           ("dp-b", services.free_port(), "1", "1")):
            if name not in want or (name == "dp-b" and not a.build_b):
                continue
            bdir = builds.get(name) or a.build
            dpexe = os.path.join(bdir, "src", "osr-dataplane")
            agent = os.path.join(bdir, "src", "osr-agent")
            env = dict(os.environ, OSR_SPLICE=splice, OSR_FDPASS=fdpass)
            sock = os.path.join(d, name + ".sock")
            procs.append(pinned(a.server_cpu, [agent, "--listen", "unix:" + sock, "--log-level",
                                               "warn"], env))
            ag = procs[-1].pid
            wrap = ["strace", "-c", "-f", "-o", os.path.join(a.strace, name + ".strace")] \
                if a.strace else []
            procs.append(pinned(a.server_cpu, wrap + [dpexe, "--listen", "127.0.0.1:%d" % port,
                                               "--keys-dir", os.path.join(d, "keys"),
                                               "--log-level", "warn"], env))
            dpp = procs[-1].pid
            if a.strace:  # the data plane itself (CPU, RSS), stopped first so strace reports
                dpp = traced_child(dpp)
                traced.append(dpp)
            osr[name] = (port, sock, [dpp, ag])
        for p in [bport, wport, nport, hport] + [v[0] for v in osr.values()]:
            services._wait_port(p)
        for _, sock, _ in osr.values():
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
        # path -> (port, URL prefix, headers, pids of the proxy processes)
        paths = {"direct": (bport, "", (), []), "nginx": (nport, "", (), [nginx_pid]),
                 "haproxy": (hport, "", (), [haproxy_pid])}
        for name, (port, sock, pids) in osr.items():
            tok = subprocess.run([mint, "sign", os.path.join(d, "keys"), "k1", "s1", "unix:" + sock,
                                  "ports", "all", "86400"], capture_output=True, text=True,
                                 check=True).stdout.strip()
            paths[name] = (port, "/sbx/s1/%d", ("X-Access-Token: " + tok,), pids)
        if "splice-relay" in want and a.only_big:
            rport = services.free_port()
            procs.append(pinned(a.server_cpu, [os.path.join(a.build, "bench", "splice_relay"),
                                               str(rport), str(bport)]))
            services._wait_port(rport)
            paths["splice-relay"] = (rport, "", (), [procs[-1].pid])
        paths = {k: v for k, v in paths.items() if k in want}

        def prefix(name, backend_port):
            p = paths[name][1]
            return p % backend_port if "%d" in p else p

        # Idle connections first, on fresh processes: memory freed by the timed
        # rounds would be reused and hide what idle connections cost.
        names = list(paths)
        idle = {}
        for name in ([] if a.only_big or a.only_exec or a.only_latency else names):
            port, _, hdr, pids = paths[name]
            if not pids:
                continue
            r0 = rss_kib(pids)
            hsocks = idle_http(port, prefix(name, bport) + "/hello", hdr, a.idle)
            time.sleep(1)
            r1 = rss_kib(pids)
            # The HTTP connections stay open while the WebSockets are measured:
            # memory they freed would be reused and hide the WebSockets' cost.
            r2 = r1
            w0 = [rss_kib([p]) for p in pids]
            socks = [ws_connect(port, prefix(name, wport) + "/ws", hdr) for _ in range(a.idle)]
            time.sleep(1)
            r3 = rss_kib(pids)
            w1 = [rss_kib([p]) for p in pids]
            for s in socks + hsocks:
                s.close()
            time.sleep(2)
            idle[name] = ((r1 - r0) / a.idle, (r3 - r2) / a.idle)
            print("idle %-9s http %.2f KiB/conn, websocket %.2f KiB/conn (RSS %d -> %d, %d -> %d KiB)"
                  % (name, idle[name][0], idle[name][1], r0, r1, r2, r3), flush=True)
            if len(pids) > 1:  # the OSR paths: the data plane alone, then the agent
                print("idle %-9s websocket: osr-dataplane %.2f + osr-agent %.2f KiB/conn" % (
                    name, (w1[0] - w0[0]) / a.idle, (w1[1] - w0[1]) / a.idle), flush=True)
        if a.only_big:
            return big_only(a, names, paths, prefix, bport, procs[0].pid)
        if a.only_exec:
            return exec_row(a, d, osr, mint, procs)
        keys = ("rps", "cpu", "p50", "p99", "p999", "big", "ws")
        res = {k: {m: [] for m in keys} for k in paths}
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                port, _, hdr, pids = paths[name]
                base = "http://127.0.0.1:%d%s" % (port, prefix(name, bport))
                c0 = cpu_s(pids)
                x0 = ctxsw(pids)
                rps, nreq = (0, 1) if a.only_latency else wrk(a.client_cpu, base + "/hello",
                                                              a.duration, a.conns, hdr)
                cpu = (cpu_s(pids) - c0) / nreq * 1e6 if pids and not a.only_latency else 0
                x1 = ctxsw(pids)
                sw = ((x1[0] - x0[0]) / nreq, (x1[1] - x0[1]) / nreq)
                err, p50, p99, p999 = openloop(olexe, a.client_cpu, port,
                                               prefix(name, bport) + "/hello", a.rate,
                                               a.rate_secs, hdr)
                ws = ws_echo_p50(wport if name == "direct" else port, prefix(name, wport) + "/ws",
                                 hdr, a.ws_n)
                big = 0 if a.no_big else download(a.client_cpu, base + "/big", hdr)
                for m, v in zip(keys, (rps, cpu, p50, p99, p999, big, ws)):
                    res[name][m].append(v)
                print("round %d %-9s %7.0f req/s %5.1f us/req %.3f/%.3f csw/req | %d/s: p50 %5d p99 %5d "
                      "p99.9 %6d us (%d errors) | ws p50 %4.0f us | 1 GiB %5.0f MB/s" % (
                          r + 1, name, rps, cpu, sw[0], sw[1], a.rate, p50, p99, p999, err, ws, big),
                      flush=True)
        med = {k: {m: statistics.median(v) for m, v in x.items()} for k, x in res.items()}
        print("\nload average: %.2f %.2f %.2f" % os.getloadavg())
        if "dp-b" in res and "dataplane" in res:
            # Same round, same load: the pairwise differences say more than
            # the medians of two noisy series.
            for m in ("p50", "p99", "p999", "ws"):
                dif = [x - y for x, y in zip(res["dataplane"][m], res["dp-b"][m])]
                print("dataplane - dp-b %s per round: %s (median %+.0f us, dataplane lower in %d of %d)"
                      % (m, " ".join("%+d" % v for v in dif), statistics.median(dif),
                         sum(v < 0 for v in dif), len(dif)))
        if a.exec_rounds > 0 and "dataplane" in osr:
            exec_row(a, d, osr, mint, procs)
        dr = med.get("direct")
        print("| path | req/s | proxy CPU µs/req | added p50 / p99 / p99.9 µs at %d/s | 1 GiB MB/s "
              "| × direct | WS echo added p50 µs | idle KiB/conn HTTP / WS |" % a.rate)
        print("|---|---|---|---|---|---|---|---|")
        for k, m in med.items():
            add = ("%+.0f / %+.0f / %+.0f" % (m["p50"] - dr["p50"], m["p99"] - dr["p99"],
                                            m["p999"] - dr["p999"])) if dr else "-"
            print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                k, "-" if a.only_latency else "%.0f" % m["rps"],
                "%.1f" % m["cpu"] if paths[k][3] and not a.only_latency else "-",
                "%d / %d / %d (abs)" % (m["p50"], m["p99"], m["p999"]) if k == "direct" else add,
                "-" if a.no_big else "%.0f" % m["big"],
                "-" if a.no_big or not dr else "%.2f" % (m["big"] / dr["big"]),
                "%.0f (abs)" % m["ws"] if k == "direct" else ("%+.0f" % (m["ws"] - dr["ws"]) if dr else "-"),
                "%.2f / %.2f" % idle[k] if k in idle else "-"))
    finally:
        for pid in traced:
            os.kill(pid, 15)
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
