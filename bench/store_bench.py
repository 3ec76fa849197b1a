#!/usr/bin/env python3
"""Durable create throughput of the binding store on SQLite and PostgreSQL.

Runs bench/store_bench (create_intent + update per sandbox, C in flight)
against a fresh SQLite file (WAL, synchronous=NORMAL, and ?sync=full) and a
PostgreSQL 15 server started here on loopback with durable settings
(fsync=on, synchronous_commit=on: the test servers of tests/lib/services.py
turn both off for speed, which would make the numbers meaningless).

Usage: bench/store_bench.py [--build DIR] [-n N] [-c C ...]
"""
import argparse
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "lib"))
import services  # noqa: E402


def run(exe, url, n, c):
    out = subprocess.run([exe, url, str(n), str(c)], capture_output=True, text=True, timeout=600)
    sys.stdout.write(out.stdout)
    sys.stdout.flush()
    if out.returncode != 0:
        sys.stderr.write(out.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(here, "..", "build-release"))
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("-c", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--no-pg", action="store_true")
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "store_bench")
    with tempfile.TemporaryDirectory(prefix="osr-store-bench-") as d:
        for c in a.c:
            run(exe, "sqlite:%s/n%d.db" % (d, c), a.n, c)
        for c in a.c:
            run(exe, "sqlite:%s/f%d.db?sync=full" % (d, c), a.n, c)
    if a.no_pg:
        return
    with services.PgServer() as pg:
        with open(os.path.join(pg.data, "postgresql.conf"), "a") as f:
            f.write("fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n")
        pg.stop()
        pg.start()
        print("postgres: fsync=%s synchronous_commit=%s" % (pg.psql("SHOW fsync").strip(),
                                                          pg.psql("SHOW synchronous_commit").strip()))
        for c in a.c:
            run(exe, pg.url, a.n, c)
        run(exe, pg.url + "?pool=4", a.n, 100)


if __name__ == "__main__":
    main()
