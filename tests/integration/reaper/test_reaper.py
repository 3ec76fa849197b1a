"""The reaper: TTL, orphans and lost resources, checked against an external
osr-sim's own list."""
import calendar
import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import gwlib  # noqa: E402
import osrtest  # noqa: E402
import services  # noqa: E402


class Reaper(unittest.TestCase):
    def setUp(self):
        self.sim = gwlib.Sim("--latency-ms", "5")
        self.gw = gwlib.Gateway([{"name": "sim", "type": "sim", "url": self.sim.url}],
                                cfg={"reaper": {"interval_ms": 300}})
        self.key = self.gw.new_key("acme")

    def tearDown(self):
        self.gw.close()
        self.sim.close()

    def sids(self):
        return {r["sandbox_id"] for r in self.sim.resources()}

    def test_ttl(self):
        short = self.gw.create(self.key, {"timeoutSeconds": 2}).json
        long = self.gw.create(self.key, {"timeoutSeconds": 600}).json
        self.assertEqual(self.sids(), {short["id"], long["id"]})
        g = self.gw.wait(lambda: (lambda j: j if j["state"] == "ended" else None)(
            self.gw.req("GET", "/v1/sandboxes/" + short["id"], key=self.key).json), timeout=15, what="ttl")
        self.assertEqual(g["endReason"], "ttl")
        self.assertEqual(self.sids(), {long["id"]})
        self.assertEqual(self.gw.req("GET", "/v1/sandboxes/" + long["id"], key=self.key).json["state"], "running")
        actions = [e["action"] for e in self.gw.req("GET", "/v1/audit", key=self.key).json["items"]]
        self.assertIn("reap.ttl", actions)

    def test_timeout_extension_is_honoured(self):
        s = self.gw.create(self.key, {"timeoutSeconds": 2}).json
        r = self.gw.req("POST", "/v1/sandboxes/%s/timeout" % s["id"], {"timeoutSeconds": 600}, key=self.key)
        self.assertEqual(r.status, 200)
        import time
        time.sleep(3)
        self.assertEqual(self.gw.req("GET", "/v1/sandboxes/" + s["id"], key=self.key).json["state"], "running")
        self.assertIn(s["id"], self.sids())

    def test_orphan_destroyed(self):
        keep = self.gw.create(self.key, {}).json
        st, body = self.sim.call("POST", "/v1/resources", {"sandbox_id": "orphanbbbbbbbbbbbbbb", "tenant": "acme"})
        self.assertEqual(st, 201, body)
        self.gw.wait(lambda: "orphanbbbbbbbbbbbbbb" not in self.sids(), timeout=15, what="orphan destroyed")
        self.assertEqual(self.sids(), {keep["id"]})
        self.assertEqual(self.gw.req("GET", "/v1/sandboxes/" + keep["id"], key=self.key).json["state"], "running")

    def test_lost(self):
        s = self.gw.create(self.key, {}).json
        other = self.gw.create(self.key, {}).json
        st, _ = self.sim.call("DELETE", "/v1/resources/" + s["binding"]["providerId"])
        self.assertEqual(st, 204)
        g = self.gw.wait(lambda: (lambda j: j if j["state"] == "lost" else None)(
            self.gw.req("GET", "/v1/sandboxes/" + s["id"], key=self.key).json), timeout=15, what="lost")
        self.assertEqual(g["endReason"], "lost")
        self.assertEqual(self.gw.req("GET", "/v1/sandboxes/" + other["id"], key=self.key).json["state"], "running")
        # gauges are refreshed by the reaper's next passes
        self.gw.wait(lambda: 'osr_sandboxes{state="lost"} 1' in
                     self.gw.req("GET", "/metrics", key=gwlib.ADMIN_KEY).raw, timeout=10, what="gauge")
        m = self.gw.req("GET", "/metrics", key=gwlib.ADMIN_KEY).raw
        self.assertIn('osr_sandboxes{state="running"} 1', m)
        self.assertIn('osr_reaper_actions_total{action="lost"} 1', m)


def rfc3339(t):
    """'2026-11-30T15:22:24.015Z' -> unix seconds."""
    return calendar.timegm(time.strptime(t[:19], "%Y-%m-%dT%H:%M:%S")) + int(t[20:23]) / 1000.0


class ReaperRace(unittest.TestCase):
    """The reaper's TTL update is a compare-and-set on the row as it read
    it. The race, made deterministic: osr-sim is frozen (SIGSTOP) between
    two reaper passes, so the next pass reads the expired row and then
    waits on its destroy call; meanwhile the owner extends the timeout (a
    store write, no provider call). When the sim thaws, the destroy
    completes and the reaper's write must lose: without the condition it
    overwrote the extension with ended/ttl and audited a reap.ttl the row
    no longer supported. With it the row keeps the owner's change, and as
    the resource really is gone, reconciliation marks it lost later.

    Pass boundaries come from the gateway's debug log: each pass ends with
    one provider listing (an HTTP/2 stream to the sim), so a "stream N
    closed" line after the create means a pass just ended and the next one
    starts about PASS_MS later."""
    STORE = None
    PASS_MS = 1000

    def setUp(self):
        self.pg = services.PgServer() if self.STORE == "pg" else None
        self.sim = gwlib.Sim("--latency-ms", "5")
        self.gw = gwlib.Gateway([{"name": "sim", "type": "sim", "url": self.sim.url}],
                                store=self.pg.url if self.pg else None,
                                cfg={"reaper": {"interval_ms": self.PASS_MS,
                                                "reconcile_interval_ms": self.PASS_MS}},
                                env={"OSR_LOG_LEVEL": "debug"})
        self.key = self.gw.new_key("acme")
        self.frozen = False

    def tearDown(self):
        if self.frozen:
            os.kill(self.sim.proc.p.pid, signal.SIGCONT)
        self.gw.close()
        self.sim.close()
        if self.pg:
            self.pg.close()

    def pass_ends(self, after_len):
        """Timestamps of provider streams closed in the log after offset after_len."""
        text = self.gw.proc.stderr_text()[after_len:]
        return [rfc3339(m.group(1)) for m in
                re.finditer(r"^(\S+Z) debug \[http2\] stream \d+ closed", text, re.M)]

    def test_extension_during_reap_is_not_overwritten(self):
        s = self.gw.create(self.key, {"timeoutSeconds": 2}).json
        sid = s["id"]
        mark = len(self.gw.proc.stderr_text())
        exp = rfc3339(s["expiresAt"])
        # The last pass to end before the expiry with the next one starting
        # after it: freeze the sim right then.
        end = time.time() + 10
        while time.time() < end:
            if [t for t in self.pass_ends(mark) if t > exp - self.PASS_MS / 1000.0 + 0.05]:
                break
            time.sleep(0.005)
        os.kill(self.sim.proc.p.pid, signal.SIGSTOP)
        self.frozen = True
        # The next pass reads the expired row and hangs in destroy.
        time.sleep(max(0.0, exp - time.time()) + self.PASS_MS / 1000.0 + 0.5)
        r = self.gw.req("POST", "/v1/sandboxes/%s/timeout" % sid, {"timeoutSeconds": 600}, key=self.key)
        self.assertEqual(r.status, 200, r.json)
        self.assertEqual(r.json["state"], "running")
        os.kill(self.sim.proc.p.pid, signal.SIGCONT)
        self.frozen = False
        self.gw.wait(lambda: sid not in {x["sandbox_id"] for x in self.sim.resources()},
                     timeout=15, what="the reaper's destroy")
        g = self.gw.wait(lambda: (lambda j: j if j["state"] != "running" else None)(
            self.gw.req("GET", "/v1/sandboxes/" + sid, key=self.key).json), timeout=15,
            what="the binding to leave running")
        self.assertEqual((g["state"], g["endReason"]), ("lost", "lost"), g)
        items = self.gw.req("GET", "/v1/audit", key=self.key).json["items"]
        ttl = [e for e in items if e["action"] == "reap.ttl" and e.get("sandboxId") == sid]
        self.assertEqual([e for e in ttl if e["outcome"] == "ok"], [], items)


class ReaperRacePg(ReaperRace):
    STORE = "pg"


class ReaperReconcile(unittest.TestCase):
    """Passes enforce TTLs every interval_ms; the providers are listed (for
    orphans and lost resources) only on the first pass and then every
    reconcile_interval_ms, since a listing costs a provider call per 256
    resources. Counted from the passes' own debug lines."""
    LINE = re.compile(r"^(\S+Z) debug \[reaper\] pass: (\d+) (live|due), (\d+) provider pages, \d+ scan "
                      r"yields( \(providers not listed\))?$", re.M)

    def setUp(self):
        self.sim = gwlib.Sim("--latency-ms", "5")
        self.gw = gwlib.Gateway([{"name": "sim", "type": "sim", "url": self.sim.url}],
                                cfg={"reaper": {"interval_ms": 100, "reconcile_interval_ms": 1500}},
                                env={"OSR_LOG_LEVEL": "debug"})
        self.key = self.gw.new_key("acme")

    def tearDown(self):
        self.gw.close()
        self.sim.close()

    def passes(self):
        """(time, bindings read, provider pages, listed) per pass."""
        return [(rfc3339(m.group(1)), int(m.group(2)), int(m.group(4)), m.group(5) is None)
                for m in self.LINE.finditer(self.gw.proc.stderr_text())
                if (m.group(3) == "live") == (m.group(5) is None)]

    def test_listing_every_reconcile_interval(self):
        keep = [self.gw.create(self.key, {"timeoutSeconds": 600}).json["id"] for _ in range(3)]
        short = self.gw.create(self.key, {"timeoutSeconds": 1}).json
        st, body = self.sim.call("POST", "/v1/resources", {"sandbox_id": "orphancccccccccccccc", "tenant": "acme"})
        self.assertEqual(st, 201, body)
        t0 = time.time()
        self.gw.wait(lambda: "orphancccccccccccccc" not in {r["sandbox_id"] for r in self.sim.resources()},
                     timeout=15, what="orphan destroyed by a listing pass")
        t_orphan = time.time() - t0
        # TTLs do not wait for a listing: passes without one end the short one.
        g = self.gw.wait(lambda: (lambda j: j if j["state"] == "ended" else None)(
            self.gw.req("GET", "/v1/sandboxes/" + short["id"], key=self.key).json), timeout=15, what="ttl")
        self.assertEqual(g["endReason"], "ttl")
        self.gw.wait(lambda: len([p for p in self.passes() if p[3]]) >= 3, timeout=20, what="three listings")
        ps = self.passes()
        self.assertEqual(len(ps), len(self.LINE.findall(self.gw.proc.stderr_text())),
                         "a listing pass reads the live bindings, the others the due ones")
        listed = [p for p in ps if p[3]]
        print("passes", len(ps), "listed", len(listed), "orphan gone after %.1f s" % t_orphan,
              file=sys.stderr)
        self.assertTrue(ps[0][3], "the first pass (reconciliation at start) lists the providers")
        self.assertTrue(all(p[2] >= 1 for p in listed), listed)
        self.assertTrue(all(p[2] == 0 for p in ps if not p[3]), ps)
        # The passes that list read every live binding (the three kept ones
        # at least); the others only the due ones (the short sandbox, once,
        # unless a listing pass ended it).
        self.assertTrue(all(p[1] >= len(keep) for p in listed[1:]), listed)
        self.assertTrue(all(p[1] <= 1 for p in ps if not p[3]), ps)
        # Listing passes are reconcile_interval_ms apart (log stamps are ms;
        # a pass ends a little after it starts), with TTL passes between.
        for a, b in zip(listed, listed[1:]):
            self.assertGreater(b[0] - a[0], 1.3, listed)
        self.assertGreater(len(ps), 3 * len(listed), ps)


class ReaperPages(unittest.TestCase):
    """A pass over 20,000 sandboxes (in-process sim, which lists in pages) is
    cut into loop turns, and the gateway keeps answering a request stream
    meanwhile. Asserted on the pass's own counts (its debug line), not on
    time: provider pages of at most 256 resources and one scan yield per
    4096 snapshot entries of the expiry and the lost scans."""
    N = int(os.environ.get("OSR_TEST_REAPER_N", "20000"))
    LINE = re.compile(r"pass: (\d+) live, (\d+) provider pages, (\d+) scan yields")

    def setUp(self):
        self.gw = gwlib.Gateway([{"name": "sim", "type": "sim", "latency_ms": 0}],
                                cfg={"reaper": {"interval_ms": 300, "reconcile_interval_ms": 300}},
                                env={"OSR_LOG_LEVEL": "debug"})
        self.key = self.gw.new_key("acme")

    def tearDown(self):
        self.gw.close()

    def passes(self):
        return [tuple(int(g) for g in m.groups()) for m in self.LINE.finditer(self.gw.proc.stderr_text())]

    def test_many_sandboxes(self):
        import concurrent.futures
        short = [self.gw.create(self.key, {"timeoutSeconds": 2}).json["id"] for _ in range(3)]
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            made = list(ex.map(lambda _: self.gw.create(self.key, {"timeoutSeconds": 600}).status,
                               range(self.N)))
        self.assertEqual(made, [201] * self.N)
        # A request stream while passes over all of them run.
        mark = len(self.passes())
        answered = []
        while len([p for p in self.passes()[mark:] if p[0] == self.N]) < 2:
            answered.append(self.gw.req("GET", "/v1/sandboxes/" + short[0], key=self.key).status)
            self.assertLess(len(answered), 100000)
        self.assertEqual(set(answered), {200})
        full = [p for p in self.passes()[mark:] if p[0] == self.N]
        print("passes", full, "answered", len(answered), file=sys.stderr)
        for live, pages, yields in full:
            self.assertGreaterEqual(pages, (self.N + 255) // 256)
            self.assertGreaterEqual(yields, 2 * (self.N // 4096))
        # Expiry still works in the paged pass, and nothing else was touched.
        for sid in short:
            self.assertEqual(self.gw.req("GET", "/v1/sandboxes/" + sid, key=self.key).json["endReason"], "ttl")
        m = self.gw.req("GET", "/metrics", key=gwlib.ADMIN_KEY).raw
        self.assertIn('osr_sandboxes{state="running"} %d' % self.N, m)
        self.assertNotIn('osr_reaper_actions_total{action="lost"}', m)
        self.assertNotIn('osr_reaper_actions_total{action="orphan"}', m)


if __name__ == "__main__":
    osrtest.run()
