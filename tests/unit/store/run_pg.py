#!/usr/bin/env python3
"""Run the store's C suite against a real PostgreSQL server.

Starts a server with tests/lib/services.py PgServer, exports its URL as
OSR_TEST_PG_URL and runs the test binary given as argv[1]. The outage tests
ask for the server to be stopped and started again: they write "stop" or
"start" (one per line) to a pipe whose fds are in OSR_TEST_PG_CTL, and we
answer "ok" once the server is down, or accepting queries again.
"""
import os
import subprocess
import sys
import threading

import services


def serve_ctl(pg, rfd, wfd):
    with os.fdopen(rfd, "r") as cmds, os.fdopen(wfd, "w") as answers:
        for line in cmds:
            cmd = line.strip()
            if cmd == "stop":
                pg.stop()
            elif cmd == "start":
                pg.start()
            else:
                answers.write("bad command\n")
                answers.flush()
                continue
            answers.write("ok\n")
            answers.flush()


def main():
    exe = sys.argv[1]
    with services.PgServer() as pg:
        # test -> us: commands; us -> test: answers.
        cmd_r, cmd_w = os.pipe()
        ans_r, ans_w = os.pipe()
        env = dict(os.environ, OSR_TEST_PG_URL=pg.url, OSR_TEST_PG_CTL="%d,%d" % (ans_r, cmd_w))
        proc = subprocess.Popen([exe], env=env, pass_fds=(ans_r, cmd_w))
        os.close(ans_r)
        os.close(cmd_w)
        t = threading.Thread(target=serve_ctl, args=(pg, cmd_r, ans_w), daemon=True)
        t.start()
        try:
            rc = proc.wait(timeout=280)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = 124
        t.join(timeout=30)
        # Whatever the suite left, every row it wrote must obey the unique key.
        try:
            dup = pg.psql("SELECT count(*) FROM (SELECT tenant, idem_key FROM bindings WHERE idem_key <> '' "
                          "GROUP BY tenant, idem_key HAVING count(*) > 1) d").strip() if pg.proc else "0"
        except subprocess.CalledProcessError as e:
            dup = "unknown (%s)" % e.stderr.strip()
        if dup != "0":
            print("duplicate (tenant, idem_key) rows: %s" % dup)
            rc = rc or 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
