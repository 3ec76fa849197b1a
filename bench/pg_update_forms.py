#!/usr/bin/env python3
"""Server CPU per binding update on PostgreSQL, for the two statement forms a
transaction in one flush can use (src/store/store.c FLUSH_UPDATE_ROWS_MIN):
k single-row B_UPDATE_AUDIT statements (prepared: a generic plan) against one
B_UPDATE_ROWS_AUDIT of k rows (planned at every execution, as store_pg.c
sends it; here plan_cache_mode = force_custom_plan), each in BEGIN ...
ROLLBACK, about 4,000 rows per form, on a table of 20,000 creating rows. The
statement texts are the gateway's own (schema.c, compiled into a small
helper with cc). CPU is the backend's utime + stime (/proc/self/stat read
with pg_read_file, 10 ms ticks) before and after, so the machine's load
changes it far less than wall time; psql sends the values as literals.

Usage: bench/pg_update_forms.py [K ...]   (default 2 4 8 16 32)
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from services import PgServer  # noqa: E402

HELPER = r"""
#include <stdio.h>
#include "store/store_int.h"
int main(void)
{
  printf("%s\n%s\n", osr__stmt_sql[OSR__ST_B_UPDATE_AUDIT], osr__stmt_sql[OSR__ST_B_UPDATE_ROWS_AUDIT]);
  return 0;
}
"""


def statement_texts():
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "t.c"), os.path.join(d, "t")
        with open(c, "w") as f:
            f.write(HELPER)
        subprocess.run(["cc", "-I" + os.path.join(ROOT, "src"), "-I" + os.path.join(ROOT, "include"), "-o", exe, c,
                        os.path.join(ROOT, "src", "store", "schema.c")], check=True)
        return subprocess.run([exe], capture_output=True, text=True, check=True).stdout.strip().split("\n")


single, multi = statement_texts()
DDL = """CREATE TABLE bindings (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, idem_key TEXT NOT NULL DEFAULT '',
 request_hash TEXT NOT NULL DEFAULT '', template_id TEXT NOT NULL DEFAULT '', provider TEXT NOT NULL DEFAULT '',
 provider_id TEXT NOT NULL DEFAULT '', region TEXT NOT NULL DEFAULT '', isolation INTEGER NOT NULL DEFAULT 0,
 agent_endpoint TEXT NOT NULL DEFAULT '', state INTEGER NOT NULL, attempt INTEGER NOT NULL DEFAULT 0,
 created_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL, expires_ms BIGINT NOT NULL DEFAULT 0,
 idle_timeout_ms BIGINT NOT NULL DEFAULT 0, last_activity_ms BIGINT NOT NULL DEFAULT 0, ended_ms BIGINT NOT NULL DEFAULT 0,
 end_reason TEXT NOT NULL DEFAULT '', request_json TEXT, granted_json TEXT, metadata_json TEXT, error_json TEXT,
 owner TEXT NOT NULL DEFAULT '');
CREATE UNIQUE INDEX bindings_idem ON bindings (tenant, idem_key) WHERE idem_key <> '';
CREATE INDEX bindings_tenant_created ON bindings (tenant, created_ms, id);
CREATE INDEX bindings_created ON bindings (created_ms, id);
CREATE INDEX bindings_state ON bindings (state);
CREATE INDEX bindings_expires ON bindings (expires_ms) WHERE expires_ms <> 0;
CREATE INDEX bindings_creating ON bindings (owner, created_ms) WHERE state = 1;
CREATE TABLE audit (seq BIGSERIAL PRIMARY KEY, at_ms BIGINT NOT NULL, tenant TEXT NOT NULL, actor TEXT NOT NULL,
 action TEXT NOT NULL, sandbox_id TEXT NOT NULL DEFAULT '', outcome TEXT NOT NULL, detail_json TEXT);
CREATE INDEX audit_tenant_seq ON audit (tenant, seq);
INSERT INTO bindings (id, tenant, state, created_ms, updated_ms, expires_ms, owner)
 SELECT 'b' || g, 't', 1, 1700000000000 + g, 1700000000000 + g, 1700003600000 + g, 'gw' FROM generate_series(1, 20000) g;
ANALYZE bindings;
"""
def upd(i):
    return ["b%d" % i, "sim-a", "res-%d" % i, "eu-west", 2, "http://10.0.0.1:49983", 2, 1, 1700000001000 + i,
            1700003600000 + i, 600000, 1700000001000 + i, 0, "", '{"vcpus":1}', None, "gw", 1, 1700000000000 + i]
def aud(i):
    return [1700000001000 + i, "t", "gateway", "create", "b%d" % i, "ok", '{"provider":"sim-a"}']
def lit(v):
    if v is None: return "NULL"
    if isinstance(v, int): return str(v)
    return "'" + v.replace("'", "''") + "'"
def arr(vals, t):
    def el(v):
        if v is None: return "NULL"
        if isinstance(v, int): return str(v)
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "'{" + ",".join(el(v) for v in vals) + "}'::" + t

T = ["text"] * 4 + ["integer", "text", "integer", "integer"] + ["bigint"] * 5 + ["text"] * 4 + ["integer", "bigint"]
AT = ["text", "bigint"] + ["text"] * 6
def script(form, k, R):
    out = ["SET plan_cache_mode = force_custom_plan;" if form == "multi" else "",
           "PREPARE s AS %s;" % (single if form == "single" else multi),
           "SELECT pg_read_file('/proc/self/stat');"]
    for r in range(R):
        base = (r * k) % 19000 + 1
        out.append("BEGIN;")
        if form == "single":
            for i in range(base, base + k):
                out.append("EXECUTE s(%s);" % ", ".join(lit(v) for v in upd(i) + [1] + aud(i)))
        else:
            rows = [upd(i) for i in range(base, base + k)]
            auds = [["b%d" % i] + aud(i) for i in range(base, base + k)]
            cols = [arr([row[c] for row in rows], T[c] + "[]") for c in range(19)]
            cols += [arr([a[c] for a in auds], AT[c] + "[]") for c in range(8)]
            out.append("EXECUTE s(%s);" % ", ".join(cols))
        out.append("ROLLBACK;")
    out.append("SELECT pg_read_file('/proc/self/stat');")
    return "\n".join(out) + "\n"

pg = PgServer()
try:
    pg.psql(DDL)
    rows_total = 4000
    for k in [int(x) for x in sys.argv[1:]] or [2, 4, 8, 16, 32]:
        for form in ("single", "multi"):
            R = rows_total // k
            args = [os.path.join(pg.bin, "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", pg.user, "-d", pg.db,
                    "-At", "-q", "-v", "ON_ERROR_STOP=1"]
            p = subprocess.run(args, input=script(form, k, R), capture_output=True, text=True, check=True)
            stats = [l for l in p.stdout.split("\n") if l.count(" ") > 20]
            f0, f1 = stats[0].split(), stats[-1].split()
            ticks = (int(f1[13]) + int(f1[14])) - (int(f0[13]) + int(f0[14]))
            us = ticks * 1e6 / os.sysconf("SC_CLK_TCK")
            print("k=%2d %-6s %5d transactions: backend CPU %.0f us per row, %.0f us per transaction"
                  % (k, form, R, us / (R * k), us / R), flush=True)
finally:
    pg.close()
