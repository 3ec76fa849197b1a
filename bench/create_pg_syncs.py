#!/usr/bin/env python3
"""WAL flushes per create with PostgreSQL (fsync on), a load-independent count.

For each gateway given (this build's, and --base-gateway), on a fresh
database of one PostgreSQL server restarted with fsync = on: N creates at
concurrency C (in-process sim), while `strace -f -c -e trace=fdatasync,fsync`
counts the flushes of the gateway's backends (the processes whose
application_name is osr-gateway: their flushes are the ones a commit waits
for) and, separately, of the rest of the server (WAL writer, checkpointer:
off every create's path). Also pg_stat_database's commits per create.

Usage: bench/create_pg_syncs.py [--build DIR] [--base-gateway EXE] [-n 3000] [-c 10]
       [--mode inproc|url] [--rounds 1] [--pg-params '?binding_commit=sync']
"""
import argparse
import os
import re
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import create_bench  # noqa: E402


def strace_count(pids):
    """Start strace -c on pids; returns the process."""
    argv = ["strace", "-f", "-c", "-e", "trace=fdatasync,fsync"]
    for p in pids:
        argv += ["-p", str(p)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def strace_stop(p):
    p.send_signal(2)
    err = p.communicate(timeout=30)[1]
    n = 0
    for ln in err.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(fdatasync|fsync)$", ln)
        if m:
            n += int(m.group(1))
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(here, "..", "build-release"))
    ap.add_argument("--base-gateway")
    ap.add_argument("-n", type=int, default=3000)
    ap.add_argument("-c", type=int, default=10)
    ap.add_argument("--mode", default="inproc", choices=["inproc", "url"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pg-params", default="", help="appended to the store URL, e.g. ?binding_commit=sync")
    a = ap.parse_args()
    ns = argparse.Namespace(build=a.build, sim=None, load=None, warmup=0, gw_cpu=1, load_cpu=0,
                            base_gateway=None, pg_params=a.pg_params)
    b = create_bench.Bench(ns)
    b.pg = b.start_pg()
    exes = [("this", None)] + ([("base", a.base_gateway)] if a.base_gateway else [])
    sim = b.start_sim() if a.mode == "url" else None
    try:
        for rnd in range(a.rounds):
            for name, exe in exes:
                g = b.start_gw("pg", a.mode, sim, exe=exe)
                b.gw_load(g, a.c, count=200)  # connections and statements prepared
                db = "bench%d" % b.ndb
                rows = b.pg.psql("SELECT pid, application_name FROM pg_stat_activity WHERE backend_type = "
                                 "'client backend' OR backend_type IN ('walwriter', 'checkpointer', "
                                 "'background writer')").split()
                gw_pids = [int(r.split("|")[0]) for r in rows if r.endswith("|osr-gateway")]
                bg = b.pg.psql("SELECT pid FROM pg_stat_activity WHERE backend_type IN ('walwriter', "
                               "'checkpointer', 'background writer')").split()
                c0 = int(b.pg.psql("SELECT xact_commit FROM pg_stat_database WHERE datname = '%s'" % db))
                s1, s2 = strace_count(gw_pids), strace_count([int(x) for x in bg])
                time.sleep(0.5)
                t0 = time.time()
                r = b.gw_load(g, a.c, count=a.n)
                dt = time.time() - t0
                n1, n2 = strace_stop(s1), strace_stop(s2)
                c1 = int(b.pg.psql("SELECT xact_commit FROM pg_stat_database WHERE datname = '%s'" % db))
                b.stop_gw(g)
                print("%s round %d: %d creates at C=%d in %.1f s (%d ok): backend flushes per create %.3f, "
                      "background flushes per create %.3f, commits per create %.2f (load %.2f)" % (
                          name, rnd, a.n, a.c, dt, r["ok"], n1 / a.n, n2 / a.n, (c1 - c0) / a.n,
                          os.getloadavg()[0]), flush=True)
    finally:
        if sim is not None:
            sim.stop()
        b.pg.close()
        create_bench.shutil.rmtree(b.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
