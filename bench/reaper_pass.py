#!/usr/bin/env python3
"""One reaper pass over N live sandboxes: how long, its longest step, its peak
memory (issue 3, "Reaper pass without a stall").

For each gateway (this build's, and --base-gateway's if given, alternating
over --rounds so both share the machine's load), starts it the way
bench/create_bench.py does (pinned to --gw-cpu, SQLite, the in-process sim or
an osr-sim in url mode, trace logging), makes N sandboxes with create_load,
lets the first pass over them finish, resets the gateway's peak RSS
(/proc/PID/clear_refs "5", so VmHWM restarts at the current RSS), waits for
--passes more passes and reports for them, from the trace lines
"[reaper] pass at T ended at T2 (N live, trim W us[, longest step S us])":
the wall time of each pass, its longest step (this tree's reaper stamps the
longest loop turn it spent in its own code, provider pages included; older
builds print no such field) and (VmHWM - VmRSS before) / N, the peak memory a
pass added per live sandbox. The wall times depend on the machine's load:
read them as A/B ratios within one run.

Usage: bench/reaper_pass.py [--build DIR] [--base-gateway EXE] [-n 20000]
       [--mode inproc|url] [--passes 2] [--rounds 1]
"""
import argparse
import os
import re
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import create_bench  # noqa: E402

PASS = re.compile(r"pass at (\d+) ended at (\d+) \((\d+) live, trim (\d+) us(?:, longest step (\d+) us)?\)")


def passes(path):
    with open(path, errors="replace") as f:
        return [tuple(int(g) if g is not None else -1 for g in m.groups()) for m in PASS.finditer(f.read())]


def one(b, a, exe, sim):
    g = b.start_gw("sqlite", a.mode, sim, exe=exe, log_level="trace")
    try:
        glog = os.path.join(g.dir, "gateway.log")
        r = b.gw_load(g, 10, count=a.n)
        if r["ok"] != a.n:
            raise RuntimeError("%d of %d creates succeeded" % (r["ok"], a.n))
        # The first pass that saw all of them, then a clean peak.
        deadline = time.time() + 120
        while not [p for p in passes(glog) if p[2] >= a.n] and time.time() < deadline:
            time.sleep(0.2)
        base = len(passes(glog))
        rss0 = create_bench.rss_kib(g.pid)
        with open("/proc/%d/clear_refs" % g.pid, "w") as f:
            f.write("5")
        while len(passes(glog)) < base + a.passes and time.time() < deadline:
            time.sleep(0.2)
        hwm = create_bench.rss_kib(g.pid, "VmHWM")
        got = [p for p in passes(glog)[base:] if p[2] >= a.n][: a.passes]
        return {"passes": [{"wall_us": t1 - t0, "live": live, "trim_us": trim, "longest_step_us": step}
                           for t0, t1, live, trim, step in got],
                "rss_before_kib": rss0, "hwm_kib": hwm,
                "peak_added_per_sandbox_b": (hwm - rss0) * 1024.0 / a.n}
    finally:
        b.stop_gw(g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(here, "..", "build-release"))
    ap.add_argument("--base-gateway", help="also measure this osr-gateway, alternating with BUILD's")
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--mode", default="inproc", choices=["inproc", "url"])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--gw-cpu", type=int, default=1)
    ap.add_argument("--load-cpu", type=int, default=0)
    a = ap.parse_args()
    ns = create_bench.argparse.Namespace(build=a.build, sim=None, load=None, warmup=0, gw_cpu=a.gw_cpu,
                                         load_cpu=a.load_cpu, base_gateway=a.base_gateway, pg_params="")
    b = create_bench.Bench(ns)
    try:
        for rnd in range(a.rounds):
            for name, exe in (("this", None), ("base", a.base_gateway)):
                if name == "base" and exe is None:
                    continue
                sim = b.start_sim() if a.mode == "url" else None
                try:
                    r = one(b, a, exe, sim)
                finally:
                    if sim is not None:
                        sim.stop()
                for p in r["passes"]:
                    step = "%d us" % p["longest_step_us"] if p["longest_step_us"] >= 0 else "not stamped"
                    print("round %d %s %s: pass %d us over %d live, longest step %s, trim %d us" % (
                        rnd + 1, name, a.mode, p["wall_us"], p["live"], step, p["trim_us"]))
                print("round %d %s %s: peak added by a pass %.0f B per live sandbox (VmHWM %d KiB, "
                      "RSS before %d KiB; load average %.2f)" % (
                          rnd + 1, name, a.mode, r["peak_added_per_sandbox_b"], r["hwm_kib"],
                          r["rss_before_kib"], os.getloadavg()[0]))
                sys.stdout.flush()
    finally:
        create_bench.shutil.rmtree(b.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
