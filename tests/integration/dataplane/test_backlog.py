#!/usr/bin/env python3
"""A burst of upstream connects larger than the agent's listen backlog.

The real osr-agent is stopped (SIGSTOP), so it accepts nothing while 700
clients send envd requests through the real osr-dataplane at once: without
a cap, 512 connects would fill the agent's backlog (511) and the rest would
be refused with EAGAIN. The data plane caps concurrent upstream connects per
agent endpoint and queues the rest in FIFO order (docs/dataplane.md,
"Connect cap"), so the backlog never fills. After the agent continues
(SIGCONT) every request gets its answer: 204, or 503 with the typed error
for requests that waited longer than the queue timeout; none hangs and none
gets a 502. A second burst with the agent stopped for longer than the queue
timeout checks the 503s and that the data plane then serves normally.
"""
import asyncio
import json
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import test_dataplane as tdp  # noqa: E402
import osrtest  # noqa: E402

N = 700  # requests per burst


async def one(port, tok, results, i, target, upgrade=False):
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        conn = "Upgrade\r\nUpgrade: websocket" if upgrade else "close"
        w.write(("GET /health HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: %d\r\n"
                 "X-Access-Token: %s\r\nConnection: %s\r\n\r\n" % (tdp.SID, target, tok, conn)).encode())
        await w.drain()
        data = await r.read()
        w.close()
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else -1
        results[i] = (status, body)
    except Exception as e:  # noqa: BLE001  (reported below)
        results[i] = (-2, repr(e).encode())


def backlog(path):
    """Connections queued on the unix listener at path, not yet accepted
    (ss's Recv-Q of a listening socket), or None if not found."""
    out = osrtest.sh(["ss", "-xln"]).stdout.decode()
    for ln in out.splitlines():
        f = ln.split()
        if len(f) >= 5 and f[4] == path:
            return int(f[2])
    return None


async def burst(port, tok, stop_s, agent_pid, sock, target=tdp.ENVD, limit_s=90, upgrade=False):
    """N requests at once while the agent is stopped for stop_s; returns the
    results, how many hung, and the largest backlog seen meanwhile."""
    results = [None] * N
    peak = 0
    os.kill(agent_pid, signal.SIGSTOP)
    try:
        tasks = [asyncio.ensure_future(one(port, tok, results, i, target, upgrade)) for i in range(N)]
        t_end = time.monotonic() + stop_s
        while time.monotonic() < t_end:
            await asyncio.sleep(0.25)
            q = backlog(sock)
            peak = max(peak, q or 0)
    finally:
        os.kill(agent_pid, signal.SIGCONT)
    done, pending = await asyncio.wait(tasks, timeout=limit_s)
    for t in pending:
        t.cancel()
    return results, len(pending), peak


def summary(results):
    out = {}
    for r in results:
        k = r[0] if r is not None else None
        out[k] = out.get(k, 0) + 1
    return out


class Backlog(unittest.TestCase):
    def test_burst_over_the_backlog(self):
        env = tdp.Env()
        try:
            tok = env.token(scopes="exec,files")
            pid = env.agent.p.pid
            # 1: the agent stops for 2 s (below the queue timeout): all 204.
            results, hung, peak = asyncio.run(burst(env.port, tok, 2.0, pid, env.sock))
            s = summary(results)
            # The cap (64) bounds what waits in the agent's backlog (511).
            self.assertGreater(peak, 0, "the backlog was never seen filling: the check is blind")
            self.assertLessEqual(peak, 64, "the agent's backlog held %d connections" % peak)
            self.assertEqual(hung, 0, "requests hung: %s\n%s" % (s, env.dp.stderr_text()[-3000:]))
            self.assertEqual(s, {204: N}, "%s\n%s" % (s, env.dp.stderr_text()[-3000:]))
            # 2: the agent stops for longer than the queue timeout: what waited
            # in the queue gets 503 with the typed error; nothing hangs or 502s.
            results, hung, peak = asyncio.run(burst(env.port, tok, 7.0, pid, env.sock))
            self.assertLessEqual(peak, 64)
            s = summary(results)
            self.assertEqual(hung, 0, "requests hung: %s" % s)
            self.assertEqual(set(s) - {204, 503}, set(), "%s\n%s" % (s, env.dp.stderr_text()[-3000:]))
            self.assertGreater(s.get(503, 0), 0, s)
            for st, body in results:
                if st == 503:
                    j = json.loads(body)
                    self.assertEqual(j["code"], 503)
                    self.assertEqual(j["type"], "upstream_busy")
                    break
            # 3: upgrades (WebSocket) to a closed port share the cap: the
            # backlog stays bounded, every one is answered (502: nothing
            # listens there) or gets the typed 503.
            results, hung, peak = asyncio.run(burst(env.port, env.token(scopes="ports"), 2.0, pid,
                                                    env.sock, target=1, upgrade=True))
            s = summary(results)
            self.assertEqual(hung, 0, "upgrades hung: %s" % s)
            self.assertGreater(peak, 0)
            self.assertLessEqual(peak, 64, "the agent's backlog held %d connections" % peak)
            self.assertEqual(set(s) - {502, 503}, set(), s)
            # 4: served normally afterwards.
            r, data = env.envd("GET", "/health", tok)
            self.assertIn(r.status, (200, 204), data)
        finally:
            self.assertEqual(env.close(), 0)


if __name__ == "__main__":
    osrtest.run()
