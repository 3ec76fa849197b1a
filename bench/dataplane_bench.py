#!/usr/bin/env python3
"""Data plane benchmark (issue 5): four paths to the same backend, side by side.

  direct     wrk/curl -> backend
  dataplane  -> osr-dataplane -> osr-agent tunnel (unix socket) -> backend
  nginx      -> nginx (proxy_pass, upstream keepalive) -> backend
  haproxy    -> haproxy (mode http, http-reuse always) -> backend

The backend is nginx serving /hello (12 bytes) and /big (a 1 GiB file).
Proxies, agent and backend are pinned to --server-cpu with one worker each,
the load generator to --client-cpu; rounds are interleaved (every path once
per round) and the median round is reported. Note that the data plane path
has one more hop than nginx/haproxy (the agent's port tunnel, as in
production): it is the full OSR path, not the proxy alone.

Measured: requests/s and p50/p99 latency with wrk (closed loop, --conns
connections; the issue's open-loop 5k req/s figure needs wrk2, not in
Debian), and the 1 GiB download throughput (curl, one stream).

Usage: bench/dataplane_bench.py [--build DIR] [--rounds N] [--duration S]
                                [--conns N] [--no-big]
Needs: wrk, curl, nginx, haproxy, taskset.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import services  # noqa: E402

BACKEND = """user root; worker_processes 1; daemon off; pid {d}/b.pid; error_log {d}/b.err warn;
events {{ worker_connections 4096; }}
http {{ access_log off; sendfile on; keepalive_requests 1000000;
  client_body_temp_path {d}/b1; proxy_temp_path {d}/b2; fastcgi_temp_path {d}/b3;
  uwsgi_temp_path {d}/b4; scgi_temp_path {d}/b5;
  server {{ listen 127.0.0.1:{port}; root {d}/www;
    location = /hello {{ default_type text/plain; return 200 "hello world\\n"; }} }} }}
"""
NGINX = """user root; worker_processes 1; daemon off; pid {d}/n.pid; error_log {d}/n.err warn;
events {{ worker_connections 4096; }}
http {{ access_log off; keepalive_requests 1000000;
  client_body_temp_path {d}/n1; proxy_temp_path {d}/n2; fastcgi_temp_path {d}/n3;
  uwsgi_temp_path {d}/n4; scgi_temp_path {d}/n5;
  upstream b {{ server 127.0.0.1:{bport}; keepalive 64; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_buffering off; }} }} }}
"""
HAPROXY = """global
  nbthread 1
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend f
  bind 127.0.0.1:{port}
  default_backend b
backend b
  server s1 127.0.0.1:{bport}
"""


def pinned(cpu, args, **kw):
    return subprocess.Popen(["taskset", "-c", str(cpu)] + args, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, **kw)


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wrk(cpu, url, duration, conns, headers=()):
    args = ["taskset", "-c", str(cpu), "wrk", "-t1", "-c%d" % conns, "-d%ds" % duration, "--latency"]
    for h in headers:
        args += ["-H", h]
    out = subprocess.run(args + [url], capture_output=True, text=True, timeout=duration + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def lat(p):
        m = re.search(r"\s%s%%\s+([\d.]+)(us|ms|s)" % p, out)
        v = float(m.group(1))
        return v * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]
    return rps, lat("50"), lat("99")


def download(cpu, url, headers=()):
    args = ["taskset", "-c", str(cpu), "curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{speed_download}"]
    for h in headers:
        args += ["-H", h]
    return float(subprocess.run(args + [url], capture_output=True, text=True, timeout=600,
                                check=True).stdout) / 1e6  # MB/s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--no-big", action="store_true")
    a = ap.parse_args()
    for tool in ("wrk", "curl", "nginx", "haproxy", "taskset"):
        if shutil.which(tool) is None:
            sys.exit("missing %s" % tool)
    dpexe = os.path.join(a.build, "src", "osr-dataplane")
    agent = os.path.join(a.build, "src", "osr-agent")
    mint = os.path.join(a.build, "tests", "integration", "dataplane", "dp-mint")
    d = tempfile.mkdtemp(prefix="osr-dpbench-")
    procs = []
    try:
        os.mkdir(os.path.join(d, "www"))
        os.mkdir(os.path.join(d, "keys"))
        if not a.no_big:
            with open(os.path.join(d, "www", "big"), "wb") as f:
                chunk = os.urandom(1 << 20)
                for _ in range(1024):
                    f.write(chunk)
        bport, nport, hport, dport = (services.free_port() for _ in range(4))
        for name, conf, port in (("backend", BACKEND, bport), ("nginx", NGINX, nport)):
            path = os.path.join(d, name + ".conf")
            with open(path, "w") as f:
                f.write(conf.format(d=d, port=port, bport=bport))
            procs.append(pinned(a.server_cpu, ["nginx", "-c", path, "-p", d]))
        path = os.path.join(d, "haproxy.cfg")
        with open(path, "w") as f:
            f.write(HAPROXY.format(port=hport, bport=bport))
        procs.append(pinned(a.server_cpu, ["haproxy", "-f", path]))
        sock = os.path.join(d, "agent.sock")
        procs.append(pinned(a.server_cpu, [agent, "--listen", "unix:" + sock, "--log-level", "warn"]))
        subprocess.run([mint, "genkey", os.path.join(d, "keys"), "k1"], check=True)
        procs.append(pinned(a.server_cpu, [dpexe, "--listen", "127.0.0.1:%d" % dport, "--keys-dir",
                                           os.path.join(d, "keys"), "--log-level", "warn"]))
        for p in (bport, nport, hport, dport):
            services._wait_port(p)
        while not os.path.exists(sock):
            time.sleep(0.05)
        tok = subprocess.run([mint, "sign", os.path.join(d, "keys"), "k1", "s1", "unix:" + sock, "ports",
                              str(bport), "86400"], capture_output=True, text=True, check=True).stdout.strip()
        paths = {
            "direct": ("http://127.0.0.1:%d" % bport, ()),
            "dataplane": ("http://127.0.0.1:%d/sbx/s1/%d" % (dport, bport), ("X-Access-Token: " + tok,)),
            "nginx": ("http://127.0.0.1:%d" % nport, ()),
            "haproxy": ("http://127.0.0.1:%d" % hport, ()),
        }
        res = {k: {"rps": [], "p50": [], "p99": [], "big": []} for k in paths}
        for r in range(a.rounds):
            for name, (base, hdr) in paths.items():
                rps, p50, p99 = wrk(a.client_cpu, base + "/hello", a.duration, a.conns, hdr)
                res[name]["rps"].append(rps)
                res[name]["p50"].append(p50)
                res[name]["p99"].append(p99)
                if not a.no_big:
                    res[name]["big"].append(download(a.client_cpu, base + "/big", hdr))
                print("round %d %-9s %9.0f req/s p50 %6.0f us p99 %6.0f us %s" % (
                    r + 1, name, rps, p50, p99,
                    "" if a.no_big else "1 GiB %.0f MB/s" % res[name]["big"][-1]), flush=True)
        med = {k: {m: statistics.median(v) if v else 0 for m, v in x.items()} for k, x in res.items()}
        print()
        print("| path | req/s | p50 µs | p99 µs | added p50 / p99 µs | 1 GiB MB/s | × direct |")
        print("|---|---|---|---|---|---|---|")
        dr = med["direct"]
        for k, m in med.items():
            print("| %s | %.0f | %.0f | %.0f | %+.0f / %+.0f | %s | %s |" % (
                k, m["rps"], m["p50"], m["p99"], m["p50"] - dr["p50"], m["p99"] - dr["p99"],
                "-" if a.no_big else "%.0f" % m["big"], "-" if a.no_big else "%.2f" % (m["big"] / dr["big"])))
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
