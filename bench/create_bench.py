#!/usr/bin/env python3
"""Router-added create overhead and memory of osr-gateway (issue 3, "Benchmark").

For each concurrency C (default 1, 10, 100) and each round, side by side:

  direct          POST /v1/resources on osr-sim (latency 0): the provider alone
  gw:<store>:url  POST /v1/sandboxes on osr-gateway whose sim provider is in url
                  mode, talking HTTP/2 to an external osr-sim (latency 0)
  gw:<store>:inproc  the same, with the sim provider in-process (latency_ms 0)

with <store> = sqlite (WAL, synchronous=NORMAL: survives a process crash),
sqlite-full (?sync=full: also survives power loss) and pg (PostgreSQL 15 from
tests/lib/services.py, restarted with fsync=on, synchronous_commit=on,
full_page_writes=on: durable); optionally pg-async (the same server, the
database set to synchronous_commit=off: not durable, a diagnostic). Every cell starts fresh processes and a fresh
database, so no cell inherits another's sandboxes; the order of the cells
rotates from round to round so drift is shared.

Placement (2 cores): the gateway alone on --gw-cpu (1); the load generator
(bench/create_load, keep-alive HTTP/1.1, one request in flight per
connection), osr-sim and PostgreSQL on --load-cpu (0). osr-sim sits on the
load CPU in the direct runs too, where it is in url mode, so that
"gateway − direct" is what the gateway hop adds.

Then memory: VmRSS of a fresh gateway with no sandboxes, and after N (10,000)
and 2N live sandboxes created through it (url mode, so the simulator's own
table is not in the gateway process; in-process figures are given too).

Output: a Markdown report (stdout, and appended to --out), raw JSON lines to
--raw. Numbers are medians over rounds; "added" is the median over rounds of
(gateway − direct) measured in the same round at the same concurrency.

Usage: bench/create_bench.py [--build DIR] [--rounds 3] [--duration 5]
       [--warmup 1] [-c 1 10 100] [--stores sqlite sqlite-full pg]
       [--modes url inproc] [--rss-n 10000] [--out FILE] [--raw FILE]
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "lib"))
import services  # noqa: E402

ADMIN_KEY = "osr-admin-bench-key-0123456789abcdef"
GW_BODY = '{"template":"base","timeoutSeconds":86400}'
# What the sim adapter sends osr-sim for that create (adapters/sim.c
# sim_create, url mode), with a unique sandbox id per request.
SIM_BODY = ('{"sandbox_id":"bench{seq}","tenant":"admin","template":"base","isolation":"container",'
            '"region":"","timeout_s":86400,"caps":{"vcpus":1,"memoryMiB":512,"gpu":{"count":0,"type":""},'
            '"snapshot":false,"ports":[]},"labels":{"osr.dev/sandbox-id":"bench{seq}",'
            '"osr.dev/tenant":"admin"}}')


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def wait_http(url, timeout=30.0, proc=None):
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("%s exited with %s" % (proc.args[0], proc.returncode))
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(url)


def cpu_seconds(pid):
    """utime+stime of every thread of pid, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid):
    """{"loop": s, "other": s}: utime+stime of the main (loop) thread and of
    every other thread (store, checkpoint, thread pool) of pid."""
    out = {"loop": 0.0, "other": 0.0}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        k = "loop" if int(tid) == pid else "other"
        out[k] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def rss_kib(pid, field="VmRSS"):
    """VmRSS (or RssAnon, RssFile, RssShmem) of pid in KiB."""
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith(field + ":"):
                return int(ln.split()[1])
    raise RuntimeError("no " + field)


def pin_group(pgid, cpu):
    """Pin every thread of every process in a process group (PostgreSQL's
    postmaster and its children; backends forked later inherit it)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.getpgid(int(d)) == pgid:
                subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), d], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        except OSError:
            pass


class Child:
    """A pinned child process in its own process group, stopped by pid."""

    def __init__(self, argv, cpu, env=None, log_path=None):
        e = dict(os.environ)
        e.update(env or {})
        self.log_path = log_path
        out = open(log_path, "wb") if log_path else subprocess.DEVNULL
        self.p = subprocess.Popen(["taskset", "-c", str(cpu)] + argv, env=e, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        self.args = argv
        self.pid = self.p.pid  # taskset execs the program: same pid

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()

    def tail(self):
        if not self.log_path:
            return ""
        with open(self.log_path, "rb") as f:
            return f.read()[-3000:].decode("utf-8", "replace")


class Bench:
    def __init__(self, a):
        self.a = a
        b = a.build
        self.gw_exe = os.path.join(b, "src", "osr-gateway")
        # --base-gateway: a second osr-gateway (e.g. built from the previous
        # commit) measured in the same rounds as cells "base:STORE:MODE", so a
        # before/after comparison shares the machine's load at the time.
        self.base_exe = a.base_gateway
        self.sim_exe = a.sim or os.path.join(b, "src", "osr-sim")
        self.load_exe = a.load or os.path.join(b, "bench", "create_load")
        for exe in (self.gw_exe, self.sim_exe, self.load_exe):
            if not os.access(exe, os.X_OK):
                sys.exit("not built: %s (meson setup build-bench --buildtype=release && ninja -C build-bench)"
                         % exe)
        self.tmp = tempfile.mkdtemp(prefix="osr-create-bench-")
        self.pg = None
        self.ndb = 0
        self.seq = int(time.time()) * 1000000

    # ---- processes -------------------------------------------------------

    def start_sim(self):
        port = services.free_port()
        s = Child([self.sim_exe, "--listen", "127.0.0.1:%d" % port, "--latency-ms", "0", "--log-level",
                   "warn"], self.a.load_cpu, log_path=os.path.join(self.tmp, "sim.log"))
        s.port = port
        wait_http("http://127.0.0.1:%d/healthz" % port, proc=s.p)
        return s

    def store_url(self, store, d):
        if store == "sqlite":
            return "sqlite:%s/osr.db" % d
        if store == "sqlite-full":
            return "sqlite:%s/osr.db?sync=full" % d
        if store in ("pg", "pg-async"):
            self.ndb += 1
            name = "bench%d" % self.ndb
            self.pg.psql("CREATE DATABASE %s" % name)
            if store == "pg-async":
                # Diagnostic only, NOT durable: commits return before the WAL
                # reaches the disk, which separates the fsync wait from the rest.
                self.pg.psql("ALTER DATABASE %s SET synchronous_commit = off" % name)
            return "postgres://osr@127.0.0.1:%d/%s%s" % (self.pg.port, name, self.a.pg_params)
        raise ValueError(store)

    def start_gw(self, store, mode, sim=None, exe=None, log_level="warn"):
        d = tempfile.mkdtemp(prefix="gw-", dir=self.tmp)
        prov = {"name": "sim", "type": "sim", "latency_ms": 0}
        if mode == "url":
            prov = {"name": "sim", "type": "sim", "url": "http://127.0.0.1:%d" % sim.port}
        cfg = {"providers": [prov], "log": {"level": log_level}}
        cfg_path = os.path.join(d, "osr.yaml")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        port = services.free_port()
        argv = [exe or self.gw_exe, "--listen", "127.0.0.1:%d" % port, "--data-dir", d, "--config", cfg_path,
                "--store", self.store_url(store, d)]
        g = Child(argv, self.a.gw_cpu, env={"OSR_ADMIN_KEY": ADMIN_KEY},
                  log_path=os.path.join(d, "gateway.log"))
        g.port, g.dir = port, d
        try:
            wait_http("http://127.0.0.1:%d/readyz" % port, proc=g.p)
        except Exception:
            log(g.tail())
            raise
        return g

    def stop_gw(self, g):
        g.stop()
        if g.p.returncode not in (0, None):
            log("gateway exited with %s:\n%s" % (g.p.returncode, g.tail()))
        shutil.rmtree(g.dir, ignore_errors=True)

    def load(self, port, path, body, conns, duration=None, count=None, headers=()):
        argv = ["taskset", "-c", str(self.a.load_cpu), self.load_exe, "--connect", "127.0.0.1:%d" % port,
                "--path", path, "--body", body, "-c", str(conns), "--seq-start", str(self.seq)]
        for h in headers:
            argv += ["-H", h]
        if count:
            argv += ["-n", str(count)]
        else:
            argv += ["-d", str(duration), "-w", str(self.a.warmup)]
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if cp.returncode != 0 or not cp.stdout.strip():
            raise RuntimeError("create_load failed (%d): %s" % (cp.returncode, cp.stderr[-2000:]))
        r = json.loads(cp.stdout)
        self.seq = r["next_seq"] + 1
        if r["errors"]:
            log("  %d errors: %s %s" % (r["errors"], r["status"], cp.stderr.strip()[-600:]))
        return r

    def gw_load(self, g, conns, **kw):
        return self.load(g.port, "/v1/sandboxes", GW_BODY, conns,
                         headers=["Authorization: Bearer " + ADMIN_KEY], **kw)

    # ---- cells -----------------------------------------------------------

    def cell(self, name, conns):
        """One measurement; returns the create_load result plus CPU use."""
        if name == "direct":
            sim = self.start_sim()
            try:
                c0 = cpu_seconds(sim.pid)
                r = self.load(sim.port, "/v1/resources", SIM_BODY, conns, duration=self.a.duration)
                r["sim_cpu_us_per_req"] = (cpu_seconds(sim.pid) - c0) * 1e6 / max(1, r["requests"])
            finally:
                sim.stop()
            return r
        kind, store, mode = name.split(":")
        sim = self.start_sim() if mode == "url" else None
        try:
            g = self.start_gw(store, mode, sim, exe=self.base_exe if kind == "base" else None)
            try:
                c0 = cpu_seconds(g.pid)
                t0 = thread_cpu(g.pid)
                s0 = cpu_seconds(sim.pid) if sim else 0
                r = self.gw_load(g, conns, duration=self.a.duration)
                r["gw_cpu_us_per_req"] = (cpu_seconds(g.pid) - c0) * 1e6 / max(1, r["requests"])
                t1 = thread_cpu(g.pid)
                r["gw_thread_cpu_us_per_req"] = {
                    k: round((v - t0.get(k, 0)) * 1e6 / max(1, r["requests"]), 1) for k, v in t1.items()}
                if sim:
                    r["sim_cpu_us_per_req"] = (cpu_seconds(sim.pid) - s0) * 1e6 / max(1, r["requests"])
            finally:
                self.stop_gw(g)
        finally:
            if sim:
                sim.stop()
        return r

    def rss(self, store, mode):
        """Idle RSS of a fresh gateway, then after N and 2N live sandboxes."""
        sim = self.start_sim() if mode == "url" else None
        try:
            g = self.start_gw(store, mode, sim)
            try:
                time.sleep(2.0)
                idle = rss_kib(g.pid)
                n = self.a.rss_n
                out = {"store": store, "mode": mode, "n": n, "idle_kib": idle,
                       "idle_anon_kib": rss_kib(g.pid, "RssAnon")}
                for k in (1, 2):
                    r = self.gw_load(g, 10, count=n)
                    if r["ok"] != n:
                        raise RuntimeError("RSS run: %d of %d creates succeeded" % (r["ok"], n))
                    # Sample every 0.25 s for longer than one reaper pass
                    # interval (5 s by default), so every figure includes a
                    # pass over the N live bindings and the provider's list:
                    # the median sample is the steady state, the highest one
                    # the peak during a pass. All fields of one sample are
                    # read together (VmRSS = RssAnon + RssFile + RssShmem).
                    samples = []
                    for _ in range(int(self.a.rss_window / 0.25)):
                        time.sleep(0.25)
                        samples.append((rss_kib(g.pid), rss_kib(g.pid, "RssAnon"),
                                        rss_kib(g.pid, "RssFile") + rss_kib(g.pid, "RssShmem")))
                    samples.sort()
                    mid = samples[len(samples) // 2]
                    out["rss%d_kib" % k], out["anon%d_kib" % k], out["file%d_kib" % k] = mid
                    out["peak%d_kib" % k] = samples[-1][0]
                out["per_sandbox_b"] = (out["rss1_kib"] - idle) * 1024.0 / n
                out["peak_per_sandbox_b"] = (out["peak1_kib"] - idle) * 1024.0 / n
                out["marginal_b"] = (out["rss2_kib"] - out["rss1_kib"]) * 1024.0 / n
                return out
            finally:
                self.stop_gw(g)
        finally:
            if sim:
                sim.stop()

    # ---- the run ---------------------------------------------------------

    def start_pg(self):
        pg = services.PgServer()
        with open(os.path.join(pg.data, "postgresql.conf"), "a") as f:
            f.write("fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n")
            # --pg-conf: more server settings, e.g. commit_delay (an operator's knob).
            for kv in getattr(self.a, "pg_conf", None) or []:
                f.write(kv + "\n")
        pg.stop()
        pg.start()
        pin_group(pg.proc.pid, self.a.load_cpu)
        self.pg_settings = "fsync=%s synchronous_commit=%s full_page_writes=%s commit_delay=%s" % (
            pg.psql("SHOW fsync").strip(), pg.psql("SHOW synchronous_commit").strip(),
            pg.psql("SHOW full_page_writes").strip(), pg.psql("SHOW commit_delay").strip())
        log("postgres:", self.pg_settings)
        return pg

    def run(self):
        a = self.a
        cells = ["direct"] + ["gw:%s:%s" % (s, m) for s in a.stores for m in a.modes]
        if self.base_exe:
            cells += ["base:%s:%s" % (s, m) for s in a.stores for m in a.modes]
        raw = []
        results = {}  # (cell, conns) -> [result per round]
        if "pg" in a.stores or "pg-async" in a.stores:
            self.pg = self.start_pg()
        try:
            for rnd in range(a.rounds):
                for conns in a.c:
                    k = rnd % len(cells)
                    order = cells[k:] + cells[:k]
                    for name in order:
                        r = self.cell(name, conns)
                        r.update(cell=name, round=rnd)
                        raw.append(r)
                        results.setdefault((name, conns), []).append(r)
                        log("round %d c=%-3d %-22s %8.0f/s p50 %6d us p99 %6d us%s" % (
                            rnd, conns, name, r["rps"], r["p50_us"], r["p99_us"],
                            "  gw cpu %.0f us/create %s" % (r["gw_cpu_us_per_req"], r["gw_thread_cpu_us_per_req"])
                            if "gw_cpu_us_per_req" in r else ""))
            mem = []
            if a.rss_n:
                for store in [s for s in a.stores if s in ("sqlite", "pg")]:
                    for mode in ("url", "inproc"):
                        m = self.rss(store, mode)
                        log("rss %s %s: %s" % (store, mode, m))
                        mem.append(m)
                        raw.append(dict(m, cell="rss"))
        finally:
            if self.pg:
                self.pg.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
        if a.raw:
            with open(a.raw, "a") as f:
                for r in raw:
                    f.write(json.dumps(r) + "\n")
        report = self.report(cells, results, mem)
        print(report)
        if a.out:
            with open(a.out, "a") as f:
                f.write("\n" + report)

    def report(self, cells, results, mem):
        a = self.a
        med = statistics.median
        lines = []
        load = os.getloadavg()
        lines.append("### %s — `%s`\n" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                        " ".join(["bench/create_bench.py"] + sys.argv[1:])))
        lines.append("Median of %d interleaved rounds, %gs measured after %gs warm-up per cell; gateway on "
                     "cpu %d, load generator, osr-sim and PostgreSQL on cpu %d. Load average at the end: "
                     "%.2f %.2f %.2f.%s\n" % (a.rounds, a.duration, a.warmup, a.gw_cpu, a.load_cpu,
                                               load[0], load[1], load[2],
                                               " PostgreSQL: %s." % self.pg_settings if self.pg else ""))
        lines.append("| path | C | creates/s | p50 µs | p99 µs | added p50 µs | added p99 µs | p99 ratio "
                     "| gw CPU µs/create (loop + other threads) |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for name in cells:
            for conns in a.c:
                rs = results.get((name, conns), [])
                if not rs:
                    continue
                ds = results[("direct", conns)]
                row = [name, str(conns), "%.0f" % med([r["rps"] for r in rs]),
                       "%d" % med([r["p50_us"] for r in rs]), "%d" % med([r["p99_us"] for r in rs])]
                if name == "direct":
                    row += ["—", "—", "—", "—"]
                else:
                    add50 = med([r["p50_us"] - d["p50_us"] for r, d in zip(rs, ds)])
                    add99 = med([r["p99_us"] - d["p99_us"] for r, d in zip(rs, ds)])
                    ratio = med([r["p99_us"] / max(1, d["p99_us"]) for r, d in zip(rs, ds)])
                    target = {10: 2000 if "sqlite" in name else 5000}.get(conns)
                    if "async" in name:
                        target = None  # not durable: no target applies
                    mark = "" if target is None else (" ✓" if add99 <= target else " ✗")
                    row += ["%+d" % add50, "**%+d**%s" % (add99, mark), "%.2f×" % ratio,
                            "%.0f (%.0f + %.0f)" % (
                                med([r["gw_cpu_us_per_req"] for r in rs]),
                                med([r["gw_thread_cpu_us_per_req"]["loop"] for r in rs]),
                                med([r["gw_thread_cpu_us_per_req"]["other"] for r in rs]))]
                errs = sum(r["errors"] for r in rs)
                if errs:
                    row[2] += " (%d errors)" % errs
                lines.append("| " + " | ".join(row) + " |")
        if mem:
            lines.append("")
            lines.append("Memory (VmRSS): idle = fresh start, no sandboxes; RSS at N = median of the samples "
                         "taken every 0.25 s for %g s after N live sandboxes were created (longer than the "
                         "reaper's interval, so a pass over them is inside the window); per sandbox = (RSS at "
                         "N − idle) / N; peak per sandbox = (highest sample − idle) / N, i.e. during a reaper "
                         "pass; marginal = (RSS at 2N − RSS at N) / N. The url rows are the gateway's own "
                         "memory (target ≤ 1 KiB per sandbox); in-process rows include the simulator's "
                         "resource table.\n" % a.rss_window)
            lines.append("| store | sim | idle MiB | N | RSS at N MiB (anon + file/shm) | per sandbox B | "
                         "peak per sandbox B | marginal B | anon per sandbox B |")
            lines.append("|---|---|---|---|---|---|---|---|---|")
            for m in mem:
                target = (" ✓" if m["per_sandbox_b"] <= 1024 else " ✗") if m["mode"] == "url" else ""
                lines.append("| %s | %s | %.1f | %d | %.1f (%.1f + %.1f) | **%.0f**%s | %.0f | %.0f | %.0f |" % (
                    m["store"], m["mode"], m["idle_kib"] / 1024, m["n"], m["rss1_kib"] / 1024,
                    m["anon1_kib"] / 1024, m["file1_kib"] / 1024, m["per_sandbox_b"], target,
                    m["peak_per_sandbox_b"], m["marginal_b"],
                    (m["anon1_kib"] - m["idle_anon_kib"]) * 1024.0 / m["n"]))
        return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(here, "..", "build-bench"))
    ap.add_argument("--sim", help="osr-sim executable (default: BUILD/src/osr-sim)")
    ap.add_argument("--load", help="create_load executable (default: BUILD/bench/create_load)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("-c", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--stores", nargs="+", default=["sqlite", "sqlite-full", "pg"],
                    choices=["sqlite", "sqlite-full", "pg", "pg-async"],
                    help="pg-async: PostgreSQL with synchronous_commit=off for that database "
                         "(not durable; a diagnostic that separates the fsync wait)")
    ap.add_argument("--modes", nargs="+", default=["url", "inproc"], choices=["url", "inproc"])
    ap.add_argument("--pg-params", default="", help="appended to the PostgreSQL URL, e.g. ?pool=4")
    ap.add_argument("--pg-conf", nargs="*", default=[],
                    help="extra postgresql.conf lines for the bench's server, e.g. commit_delay=200 commit_siblings=2")
    ap.add_argument("--rss-n", type=int, default=10000, help="0: skip the memory part")
    ap.add_argument("--rss-window", type=float, default=6.0,
                    help="seconds of RSS samples after each burst (longer than the reaper interval)")
    ap.add_argument("--gw-cpu", type=int, default=1)
    ap.add_argument("--load-cpu", type=int, default=0)
    ap.add_argument("--base-gateway", help="a second osr-gateway executable measured in the same "
                    "rounds as cells base:STORE:MODE (before/after comparisons)")
    ap.add_argument("--out", help="append the Markdown report to this file")
    ap.add_argument("--raw", help="append raw JSON lines to this file")
    a = ap.parse_args()
    Bench(a).run()


if __name__ == "__main__":
    main()
