#!/usr/bin/env python3
"""HTTP benchmark: osr-testd (the OSR network core) side by side with nginx.

Both servers answer the same bytes on the same machine, each pinned to the
same core (--server-cpu, default 1) with one worker; the load generator runs
on the other core (--client-cpu, default 0). Rounds are interleaved
(osr, nginx, osr, nginx, ...) so drift hits both alike; the median round is
reported, with ratios osr/nginx.

Workloads:
  hello-h1   GET /hello (12-byte body), HTTP/1.1 keep-alive, wrk
  echo-h1    POST /echo with a 16 KiB body echoed back, HTTP/1.1, wrk
  hello-h2   GET /hello over h2c prior knowledge, h2load (10 streams/conn)
  echo-h2    POST /echo with a 16 KiB body over h2c, h2load

Equal CPU budget (--cpu-quota Q, e.g. 0.5): every round is run twice per
server, unconstrained as above and then inside a CPU cgroup limited to Q of
one CPU (cgroup v2 cpu.max, or cgroup v1 cpu.cfs_quota_us where the cpu
controller is bound to v1; with the highest CPU weight, so that other load
does not eat into the budget), created and removed by the script. The server
(nginx: master and its one worker) runs inside; the load generator stays
outside on its own core, so under the quota the server, not wrk, is the
bottleneck, and req/s compares CPU cost per request at equal CPU. Every
round of both modes is printed (req/s, server CPU µs/req, osr/nginx ratio).

Usage: bench/http_bench.py [--build DIR] [--rounds N] [--duration S]
                           [--conns N] [--out FILE] [--cpu-quota Q]
Needs: wrk, h2load (nghttp2-client), nginx-light + libnginx-mod-http-echo
(scripts/install-deps.sh --bench).
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dataplane_bench  # noqa: E402  (idle-connection client and RSS reader)

NGINX_CONF = """
load_module /usr/lib/nginx/modules/ngx_http_echo_module.so;
worker_processes 1;
worker_cpu_affinity {affinity};
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 60s;
  client_body_buffer_size 64k;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  server {{
    listen 127.0.0.1:{port};
    listen 127.0.0.1:{h2port} http2;
    location = /hello {{ default_type text/plain; return 200 "hello world\\n"; }}
    location = /echo {{ echo_read_request_body; echo_request_body; }}
  }}
}}
"""


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, timeout=10):
    import socket
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("port %d never opened" % port)


class CpuQuota:
    """A CPU cgroup limited to `quota` of one CPU (period 100 ms), created on
    enter and removed on exit. cgroup v2 (cpu.max) where the cpu controller
    is on the unified hierarchy, else cgroup v1 (cpu.cfs_quota_us)."""

    PERIOD_US = 100000

    def __init__(self, quota):
        self.quota = quota
        self.path = None
        self.kind = None

    @staticmethod
    def _v2_root():
        for line in open("/proc/self/mounts"):
            f = line.split()
            if f[2] == "cgroup2":
                try:
                    with open(os.path.join(f[1], "cgroup.controllers")) as c:
                        if "cpu" in c.read().split():
                            return f[1]
                except OSError:
                    pass
        return None

    @staticmethod
    def _v1_root():
        for line in open("/proc/self/mounts"):
            f = line.split()
            if f[2] == "cgroup" and "cpu" in f[3].split(","):
                return f[1]
        return None

    def __enter__(self):
        name = "osr-http-bench-%d" % os.getpid()
        quota_us = int(self.quota * self.PERIOD_US)
        root = self._v2_root()
        if root is not None:
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
            self.path, self.kind = os.path.join(root, name), "cgroup v2 cpu.max"
            os.mkdir(self.path)
            with open(os.path.join(self.path, "cpu.max"), "w") as f:
                f.write("%d %d" % (quota_us, self.PERIOD_US))
            with open(os.path.join(self.path, "cpu.weight"), "w") as f:
                f.write("10000")  # see the v1 branch
        else:
            root = self._v1_root()
            if root is None:
                raise RuntimeError("--cpu-quota: no cgroup with the cpu controller mounted")
            self.path, self.kind = os.path.join(root, name), "cgroup v1 cpu.cfs_quota_us"
            os.mkdir(self.path)
            with open(os.path.join(self.path, "cpu.cfs_period_us"), "w") as f:
                f.write(str(self.PERIOD_US))
            with open(os.path.join(self.path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(quota_us))
            # The highest weight as well, so other load on the machine does
            # not take the budget away: the quota, not contention, limits.
            with open(os.path.join(self.path, "cpu.shares"), "w") as f:
                f.write("262144")
        return self

    def describe(self):
        return "%s = %d µs per %d µs (%.2f of a CPU)" % (
            self.kind, int(self.quota * self.PERIOD_US), self.PERIOD_US, self.quota)

    def join(self):
        """preexec_fn for a server: move the child into the group before it
        execs (nginx's worker, forked later, inherits it)."""
        path = self.path

        def move():
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        return move

    def throttled(self):
        """(periods throttled, of periods run) so far: shows that the quota binds."""
        st = {}
        try:
            with open(os.path.join(self.path, "cpu.stat")) as f:
                for line in f:
                    k, v = line.split()
                    st[k] = int(v)
        except OSError:
            pass
        return st.get("nr_throttled", 0), st.get("nr_periods", 0)

    def __exit__(self, *exc):
        if self.path is None:
            return
        for _ in range(50):  # the servers' exit may still be in progress
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)
        print("warning: could not remove %s" % self.path, file=sys.stderr)


def start_osr(build, cpu, preexec=None):
    exe = os.path.join(build, "tests", "osr-testd")
    p = subprocess.Popen(["taskset", "-c", str(cpu), exe, "--listen", "127.0.0.1:0",
                          "--log-level", "error", "--max-conns", "20000"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         preexec_fn=preexec)
    port = None
    for line in p.stdout:
        if line.startswith("listening "):
            port = int(line.split()[-1])
        if line.startswith("ready"):
            break
    return p, port, port  # the same port serves HTTP/1.1 and h2c


def start_nginx(cpu, tmp, preexec=None):
    port, h2port = free_port(), free_port()
    for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    conf = os.path.join(tmp, "nginx.conf")
    affinity = "1" + "0" * cpu  # bitmask with only `cpu` set
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(dir=tmp, port=port, h2port=h2port, affinity=affinity))
    p = subprocess.Popen(["nginx", "-c", conf, "-p", tmp], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, preexec_fn=preexec)
    wait_port(port)
    wait_port(h2port)
    return p, port, h2port


def proc_tree_cpu(pid):
    """User + system CPU seconds of pid and its children (nginx's worker)."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        pids += [int(x) for x in out.split()]
    except OSError:
        pass
    total = 0
    for q in pids:
        try:
            with open("/proc/%d/stat" % q) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            pass
    return total / tick


def rss_kib(pid):
    """VmRSS of pid and its children (nginx's worker), KiB."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return dataplane_bench.rss_kib([pid] + [int(x) for x in out.split()])


def idle_rss(pid, port, n):
    """RSS growth per idle keep-alive connection, KiB: n connections, one GET
    /hello answered on each (dataplane_bench's client), then left open."""
    time.sleep(0.5)
    r0 = rss_kib(pid)
    socks = dataplane_bench.idle_http(port, "/hello", (), n)
    try:
        time.sleep(1)
        return (rss_kib(pid) - r0) / n
    finally:
        for s in socks:
            s.close()


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def wrk(cpu, url, duration, conns, script=None):
    args = ["taskset", "-c", str(cpu), "wrk", "-t1", "-c%d" % conns, "-d%ds" % duration, "--latency"]
    if script:
        args += ["-s", script]
    out = subprocess.run(args + [url], capture_output=True, text=True, timeout=duration + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    nreq = int(re.search(r"(\d+) requests in", out).group(1))
    lat = {}
    for pct in ("50", "99"):
        m = re.search(r"\s%s(?:\.000)?%%\s+([\d.]+)(us|ms|s)" % pct, out)
        v = float(m.group(1))
        lat[pct] = v * {"us": 1, "ms": 1000, "s": 1e6}[m.group(2)]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock_err = re.search(r"Socket errors: (.*)", out)
    if errors or sock_err:
        print("  warning: %s %s" % (errors.group(0) if errors else "", sock_err.group(0) if sock_err else ""),
              file=sys.stderr)
    return {"rps": rps, "n": nreq, "p50_us": lat["50"], "p99_us": lat["99"]}


def h2load(cpu, url, duration, conns, data=None):
    args = ["taskset", "-c", str(cpu), "h2load", "-t1", "-c%d" % conns, "-m10", "-D%d" % duration]
    if data:
        args += ["-d", data]
    out = subprocess.run(args + [url], capture_output=True, text=True, timeout=duration + 60).stdout
    m = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    st = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", out)
    lat = re.search(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", out)
    if m is None or st is None:
        raise RuntimeError("h2load output not understood:\n" + out)
    if int(st.group(2)) != 0:
        print("  warning: h2load %s failed requests" % st.group(2), file=sys.stderr)
    mean = float(lat.group(5)) * {"us": 1, "ms": 1000, "s": 1e6}[lat.group(6)] if lat else float("nan")
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done", out)
    return {"rps": float(m.group(1)), "n": int(done.group(1)), "mean_us": mean}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--only", default="hello-h1,hello-h1-pipe8,echo-h1,hello-h2,echo-h2")
    ap.add_argument("--out", default=None, help="append a markdown report to this file")
    ap.add_argument("--base", default=None,
                    help="also run osr-testd from this build (e.g. /work/wt/base/build-release) in the "
                         "same interleaved rounds: an A/B of two OSR builds, reported as osr / base")
    ap.add_argument("--idle", type=int, default=0,
                    help="before the rounds, open N idle HTTP/1.1 keep-alive connections (one GET "
                         "each) to a fresh server and report its RSS growth per connection")
    ap.add_argument("--cpu-quota", type=float, default=0,
                    help="also run every round with each server inside a CPU cgroup limited to this "
                         "fraction of one CPU (e.g. 0.5); see the file comment")
    a = ap.parse_args()
    if a.cpu_quota < 0 or a.cpu_quota > os.cpu_count():
        sys.exit("--cpu-quota: between 0 and %d" % os.cpu_count())
    for tool in ("wrk", "h2load", "nginx", "taskset"):
        if shutil.which(tool) is None:
            sys.exit("missing %s: run scripts/install-deps.sh --bench" % tool)

    tmp = tempfile.mkdtemp(prefix="osr-bench-")
    body = os.path.join(tmp, "body16k")
    with open(body, "wb") as f:
        f.write(bytes((i * 31 + 11) & 0xFF for i in range(16384)))
    lua = os.path.join(tmp, "post.lua")
    with open(lua, "w") as f:
        f.write('wrk.method = "POST"\nlocal f = io.open("%s", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
                'wrk.headers["Content-Type"] = "application/octet-stream"\n' % body)

    # Pipelined HTTP/1.1 (wrk's own pipelining recipe, depth 8): the load
    # generator spends far less per request, so the server's core, not the
    # client's, is what saturates. Shows whether hello-h1 is client-bound.
    pipe = os.path.join(tmp, "pipe.lua")
    with open(pipe, "w") as f:
        f.write('init = function(args)\n  local r = {}\n  for i = 1, 8 do r[i] = wrk.format(nil, "/hello") end\n'
                '  req = table.concat(r)\nend\nrequest = function() return req end\n')

    workloads = {
        "hello-h1-pipe8": lambda port, h2port: wrk(a.client_cpu, "http://127.0.0.1:%d/hello" % port, a.duration, a.conns, pipe),
        "hello-h1": lambda port, h2port: wrk(a.client_cpu, "http://127.0.0.1:%d/hello" % port, a.duration, a.conns),
        "echo-h1": lambda port, h2port: wrk(a.client_cpu, "http://127.0.0.1:%d/echo" % port, a.duration, a.conns, lua),
        "hello-h2": lambda port, h2port: h2load(a.client_cpu, "http://127.0.0.1:%d/hello" % h2port, a.duration, a.conns),
        "echo-h2": lambda port, h2port: h2load(a.client_cpu, "http://127.0.0.1:%d/echo" % h2port, a.duration, a.conns, body),
    }
    chosen = [w for w in a.only.split(",") if w]
    servers = ["osr", "nginx"] + (["base"] if a.base else [])

    def start(name, preexec=None):
        if name == "osr":
            return start_osr(a.build, a.server_cpu, preexec)
        if name == "base":
            return start_osr(a.base, a.server_cpu, preexec)
        return start_nginx(a.server_cpu, tmp, preexec)

    idle = {}
    if a.idle:
        for name in servers:
            p, port, _ = start(name)
            try:
                idle[name] = idle_rss(p.pid, port, a.idle)
                print("idle %-6s %.2f KiB/conn" % (name, idle[name]), flush=True)
            finally:
                stop(p)
    modes = ["free"] + (["quota"] if a.cpu_quota else [])
    results = {m: {w: {n: [] for n in servers} for w in chosen} for m in modes}
    quota = CpuQuota(a.cpu_quota) if a.cpu_quota else None
    try:
        if quota is not None:
            quota.__enter__()
            print("quota: " + quota.describe(), flush=True)
        for r in range(a.rounds):
            for mode in modes:
                for name in servers:
                    p, port, h2port = start(name, quota.join() if mode == "quota" else None)
                    try:
                        for w in chosen:
                            cpu0 = proc_tree_cpu(p.pid)
                            th0 = quota.throttled() if mode == "quota" else (0, 0)
                            res = workloads[w](port, h2port)
                            res["srv_us"] = (proc_tree_cpu(p.pid) - cpu0) * 1e6 / max(res["n"], 1)
                            if mode == "quota":
                                th1 = quota.throttled()
                                res["throttled"] = "%d/%d" % (th1[0] - th0[0], th1[1] - th0[1])
                            results[mode][w][name].append(res)
                            print("round %d %-5s %-6s %-9s %s" % (r + 1, mode, name, w, res), flush=True)
                    finally:
                        stop(p)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if quota is not None:
            quota.__exit__(None, None, None)

    cmd = "bench/http_bench.py " + " ".join(sys.argv[1:])
    load = "load average %.2f %.2f %.2f at the end" % os.getloadavg()
    lines = ["", "### %s — `%s`" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cmd.strip()), "",
             load + ".", "",
             "Median of %d interleaved rounds, %ds each, %d connections; servers on cpu %d, load on cpu %d." % (
                 a.rounds, a.duration, a.conns, a.server_cpu, a.client_cpu), "",
             "Server CPU µs/req: the server's user + system CPU over the run (nginx: master + worker) divided by",
             "the requests; it does not depend on whether the load generator or the server saturates first.", "",
             "| workload | osr req/s | nginx req/s | ratio | osr p50 / p99 µs | nginx p50 / p99 µs | server CPU µs/req osr / nginx |",
             "|---|---|---|---|---|---|---|"]
    def med(rs, key):
        return statistics.median(x[key] for x in rs)

    def lat(rs):
        if "p50_us" in rs[0]:
            return "%.0f / %.0f" % (med(rs, "p50_us"), med(rs, "p99_us"))
        return "mean %.0f" % med(rs, "mean_us")

    for w in chosen:
        o, n = results["free"][w]["osr"], results["free"][w]["nginx"]
        lines.append("| %s | %.0f | %.0f | **%.2f×** | %s | %s | %.2f / %.2f |" % (
            w, med(o, "rps"), med(n, "rps"), med(o, "rps") / med(n, "rps"), lat(o), lat(n),
            med(o, "srv_us"), med(n, "srv_us")))
    def pair_table(mode, other):
        """Median req/s and server CPU of osr against `other`, one row per workload."""
        out = ["| workload | osr req/s | %s req/s | osr / %s | server CPU µs/req osr / %s |" % (
                   other, other, other), "|---|---|---|---|---|"]
        for w in chosen:
            o, b = results[mode][w]["osr"], results[mode][w][other]
            out.append("| %s | %.0f | %.0f | **%.3f×** | %.2f / %.2f |" % (
                w, med(o, "rps"), med(b, "rps"), med(o, "rps") / med(b, "rps"), med(o, "srv_us"),
                med(b, "srv_us")))
        return out

    if a.base:
        lines += ["", "A/B against `%s` (same rounds, interleaved osr, nginx, base):" % a.base, ""]
        lines += pair_table("free", "base")
    if quota is not None:
        lines += ["", "**Equal CPU budget**: each server inside %s; the load generator outside, on cpu %d." % (
                      quota.describe(), a.client_cpu),
                  "Throttled = CFS periods in which the group hit its quota / periods it ran.", ""]
        lines += pair_table("quota", "nginx")
        if a.base:
            lines += [""] + pair_table("quota", "base")
        lines += ["", "Every round under the quota, in the order run:", "",
                  "| round | workload | " + " | ".join("%s req/s (µs/req, throttled)" % k for k in servers) +
                  " | osr / nginx |", "|---|---|" + "---|" * len(servers) + "---|"]
        for r in range(a.rounds):
            for w in chosen:
                rs = {k: results["quota"][w][k][r] for k in servers}
                lines.append("| %d | %s | " % (r + 1, w) + " | ".join(
                    "%.0f (%.2f, %s)" % (rs[k]["rps"], rs[k]["srv_us"], rs[k]["throttled"]) for k in servers) +
                    " | %.3f× |" % (rs["osr"]["rps"] / rs["nginx"]["rps"]))
    if idle:
        lines += ["", "Idle HTTP/1.1 keep-alive connections (%d, RSS growth / N): " % a.idle +
                  ", ".join("%s %.2f KiB/conn" % (k, v) for k, v in idle.items()) + "."]
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        with open(a.out, "a") as f:
            f.write(report)


if __name__ == "__main__":
    main()
