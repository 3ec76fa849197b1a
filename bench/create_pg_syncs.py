#!/usr/bin/env python3
"""WAL flushes, commits, round trips and CPU per create with PostgreSQL (fsync on):
load-independent counts.

For each gateway given (this build's, and --base-gateway), on a fresh
database of one PostgreSQL server restarted with fsync = on: N creates at
concurrency C (in-process sim), while `strace -f -c -e trace=fdatasync,fsync`
counts the flushes of the gateway's backends (the processes whose
application_name is osr-gateway: their flushes are the ones a commit waits
for) and, separately, of the rest of the server (WAL writer, checkpointer:
off every create's path). Also pg_stat_database's commits per create.

Usage: bench/create_pg_syncs.py [--build DIR] [--base-gateway EXE] [-n 3000] [-c 10]
       [--mode inproc|url] [--rounds 1] [--pg-params '?binding_commit=sync'] [--syscalls]
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


def strace_count(pids, calls="fdatasync,fsync", follow=True):
    """Start strace -c on pids (with their threads when follow); returns
    the process."""
    argv = ["strace"] + (["-f"] if follow else []) + ["-c", "-e", "trace=" + calls]
    for p in pids:
        argv += ["-p", str(p)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def strace_stop(p):
    """Stop strace -c; returns {system call: calls}."""
    p.send_signal(2)
    err = p.communicate(timeout=30)[1]
    out = {}
    for ln in err.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", ln)
        if m and m.group(2) != "total":
            out[m.group(2)] = int(m.group(1))
    return out


def flushes(p):
    c = strace_stop(p)
    return c.get("fdatasync", 0) + c.get("fsync", 0)


def proc_cpu(pid):
    """utime+stime of pid (all its threads), seconds; 0 if it is gone."""
    try:
        return create_bench.cpu_seconds(pid)
    except OSError:
        return 0.0


def store_tids(pid):
    """The gateway's store worker threads: named osr-store (this build), else
    every thread but the loop (older builds do not name them)."""
    tids, rest = [], []
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, t)) as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm.startswith("osr-store"):
            tids.append(int(t))
        elif int(t) != pid:
            rest.append(int(t))
    return tids or rest


NET = "sendto,recvfrom,poll,ppoll,read,write,sendmsg,recvmsg,futex"


def wal_stats(pg):
    s, w = pg.psql("SELECT wal_sync, wal_write FROM pg_stat_wal").strip().split("|")
    return int(s), int(w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(here, "..", "build-release"))
    ap.add_argument("--base-gateway")
    ap.add_argument("-n", type=int, default=3000)
    ap.add_argument("-c", type=int, default=10)
    ap.add_argument("--mode", default="inproc", choices=["inproc", "url"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pg-params", default="", help="appended to the store URL, e.g. ?binding_commit=sync")
    ap.add_argument("--pg-conf", nargs="*", default=[], help="extra postgresql.conf lines")
    ap.add_argument("--syscalls", action="store_true",
                    help="then N more creates with the store threads under strace -c")
    a = ap.parse_args()
    ns = argparse.Namespace(build=a.build, sim=None, load=None, warmup=0, gw_cpu=1, load_cpu=0,
                            base_gateway=None, pg_params=a.pg_params, pg_conf=a.pg_conf)
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
                # Untraced: commits, the server's WAL flushes and CPU.
                c0 = int(b.pg.psql("SELECT xact_commit FROM pg_stat_database WHERE datname = '%s'" % db))
                w0 = wal_stats(b.pg)
                cpu0 = sum(proc_cpu(p) for p in gw_pids)
                g0 = proc_cpu(g.pid)
                t0 = time.time()
                r = b.gw_load(g, a.c, count=a.n)
                dt = time.time() - t0
                c1 = int(b.pg.psql("SELECT xact_commit FROM pg_stat_database WHERE datname = '%s'" % db))
                w1 = wal_stats(b.pg)
                cpu1 = sum(proc_cpu(p) for p in gw_pids)
                g1 = proc_cpu(g.pid)
                print("%s round %d: %d creates at C=%d in %.2f s (%d ok, %d backends): commits %.3f, "
                      "pg_stat_wal wal_sync %.3f wal_write %.3f, backend CPU %.0f us, gateway CPU %.0f us "
                      "per create (load %.2f)" % (
                          name, rnd, a.n, a.c, dt, r["ok"], len(gw_pids), (c1 - c0) / a.n,
                          (w1[0] - w0[0]) / a.n, (w1[1] - w0[1]) / a.n, (cpu1 - cpu0) * 1e6 / a.n,
                          (g1 - g0) * 1e6 / a.n, os.getloadavg()[0]), flush=True)
                c0 = int(b.pg.psql("SELECT xact_commit FROM pg_stat_database WHERE datname = '%s'" % db))
                s1, s2 = strace_count(gw_pids), strace_count([int(x) for x in bg])
                time.sleep(0.5)
                t0 = time.time()
                r = b.gw_load(g, a.c, count=a.n)
                dt = time.time() - t0
                n1, n2 = flushes(s1), flushes(s2)
                c1 = int(b.pg.psql("SELECT xact_commit FROM pg_stat_database WHERE datname = '%s'" % db))
                print("%s round %d: %d creates at C=%d in %.1f s (%d ok): backend flushes per create %.3f, "
                      "background flushes per create %.3f, commits per create %.2f (load %.2f)" % (
                          name, rnd, a.n, a.c, dt, r["ok"], n1 / a.n, n2 / a.n, (c1 - c0) / a.n,
                          os.getloadavg()[0]), flush=True)
                if a.syscalls:
                    tids = store_tids(g.pid)
                    sc = strace_count(tids, NET, follow=False)
                    time.sleep(0.5)
                    b.gw_load(g, a.c, count=a.n)
                    counts = strace_stop(sc)
                    print("%s round %d: store threads (%d) system calls per create: %s" % (
                        name, rnd, len(tids), ", ".join("%s %.2f" % (k, v / a.n)
                                                        for k, v in sorted(counts.items()))), flush=True)
                b.stop_gw(g)
    finally:
        if sim is not None:
            sim.stop()
        b.pg.close()
        create_bench.shutil.rmtree(b.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
