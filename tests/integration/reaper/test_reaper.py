"""The reaper: TTL, orphans and lost resources, checked against an external
osr-sim's own list."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import gwlib  # noqa: E402
import osrtest  # noqa: E402


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


if __name__ == "__main__":
    osrtest.run()
