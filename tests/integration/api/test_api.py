"""The sandbox API: create/get/list/kill/timeout/plan/providers over HTTP/1.1
and HTTP/2, on SQLite and PostgreSQL, with and without Redis; idempotency;
failover and the breaker; typed errors; tenancy; store and Redis outages."""
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gwlib  # noqa: E402
import osrtest  # noqa: E402
import services  # noqa: E402

SIM = [{"name": "sim", "type": "sim", "latency_ms": 5, "seed": 1}]


def check_sandbox(tc, s, provider="sim"):
    tc.assertEqual(len(s["id"]), 20)
    tc.assertEqual(s["state"], "running")
    tc.assertEqual(s["binding"]["provider"], provider)
    tc.assertTrue(s["binding"]["providerId"])
    tc.assertIn(s["binding"]["isolation"], ("container", "gvisor", "firecracker"))
    tc.assertIsInstance(s["binding"]["capabilities"], dict)
    tc.assertTrue(s["token"].startswith("osr1."))
    for k in ("tokenExpiresAt", "createdAt", "expiresAt", "dataplaneUrl"):
        tc.assertTrue(s[k], k)


class Happy:
    """Mixin: the happy paths, run against the store/Redis of the subclass."""
    store = None
    redis = None

    def gateway(self):
        return gwlib.Gateway(SIM, store=self.store, redis=self.redis)

    def test_lifecycle_http1_http2(self):
        with self.gateway() as gw:
            key = gw.new_key("acme")
            body = {"template": "base", "capabilities": {"ports": [8080], "isolation": "container"},
                    "timeoutSeconds": 120, "metadata": {"team": "a", "run": "1"}, "env": {"X": "y"}}
            # HTTP/1.1 (urllib), HTTP/1.1 (curl) and HTTP/2 prior knowledge (curl).
            r1 = gw.create(key, body)
            self.assertEqual(r1.status, 201, r1)
            check_sandbox(self, r1.json)
            self.assertEqual(r1.json["metadata"], {"team": "a", "run": "1"})
            self.assertIn(8080, r1.json["binding"]["capabilities"]["ports"])
            r2 = gw.curl("POST", "/v1/sandboxes", dict(body, metadata={"team": "b"}), key=key)
            self.assertEqual((r2.status, r2.version), (201, "1.1"), r2)
            r3 = gw.curl("POST", "/v1/sandboxes", dict(body, metadata={"team": "b"}), key=key, h2=True)
            self.assertEqual((r3.status, r3.version), (201, "2"), r3)
            ids = {r1.json["id"], r2.json["id"], r3.json["id"]}
            self.assertEqual(len(ids), 3)

            g = gw.curl("GET", "/v1/sandboxes/" + r1.json["id"], key=key, h2=True)
            self.assertEqual(g.status, 200, g)
            self.assertEqual(g.json["id"], r1.json["id"])
            self.assertNotIn("token", g.json)

            items = gw.list_all(key)
            self.assertEqual({s["id"] for s in items}, ids)
            # metadata filters: E2B form and metadata.k=v form
            self.assertEqual({s["id"] for s in gw.list_all(key, "metadata=team%3Db")},
                             {r2.json["id"], r3.json["id"]})
            self.assertEqual({s["id"] for s in gw.list_all(key, "metadata.team=a&metadata.run=1")},
                             {r1.json["id"]})
            # pagination
            r = gw.req("GET", "/v1/sandboxes?limit=2", key=key)
            self.assertEqual(len(r.json["items"]), 2)
            self.assertTrue(r.json["nextCursor"])
            r = gw.req("GET", "/v1/sandboxes?limit=2&cursor=" + r.json["nextCursor"], key=key)
            self.assertEqual(len(r.json["items"]), 1)

            # timeout
            t = gw.req("POST", "/v1/sandboxes/%s/timeout" % r1.json["id"], {"timeoutSeconds": 600}, key=key)
            self.assertEqual(t.status, 200, t)
            self.assertGreater(t.json["expiresAt"], r1.json["expiresAt"])
            bad = gw.req("POST", "/v1/sandboxes/%s/timeout" % r1.json["id"], {"timeoutSeconds": "x"}, key=key)
            self.assertEqual((bad.status, bad.code), (400, "invalid_request"))

            # kill, then it is ended; a second kill is idempotent
            d = gw.curl("DELETE", "/v1/sandboxes/" + r1.json["id"], key=key, h2=True)
            self.assertEqual(d.status, 204, d)
            g = gw.req("GET", "/v1/sandboxes/" + r1.json["id"], key=key)
            self.assertEqual((g.json["state"], g.json["endReason"]), ("ended", "killed"))
            self.assertEqual(gw.req("DELETE", "/v1/sandboxes/" + r1.json["id"], key=key).status, 204)
            running = gw.list_all(key, "state=running")
            self.assertEqual({s["id"] for s in running}, {r2.json["id"], r3.json["id"]})
            self.assertEqual(gw.req("GET", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa", key=key).code, "not_found")
            self.assertEqual(gw.req("DELETE", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa", key=key).status, 404)

            # plan and providers
            p = gw.curl("POST", "/v1/plan", body, key=key, h2=True)
            self.assertEqual(p.status, 200, p)
            self.assertIn("sim", json.dumps(p.json))
            pr = gw.req("GET", "/v1/providers", key=key)
            self.assertEqual(pr.status, 200, pr)
            self.assertEqual(pr.json["providers"][0]["name"], "sim")
            # nothing was created by the plan
            self.assertEqual(len(gw.list_all(key)), 3)

            # audit has the creates and the kill
            a = gw.req("GET", "/v1/audit", key=key)
            actions = [e["action"] for e in a.json["items"]]
            self.assertIn("create", actions)
            self.assertIn("kill", actions)


class HappySqlite(Happy, unittest.TestCase):
    pass


class HappyPostgresRedis(Happy, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pg = services.PgServer()
        cls.rd = services.RedisServer()
        cls.store = cls.pg.url
        cls.redis = cls.rd.url

    @classmethod
    def tearDownClass(cls):
        cls.pg.close()
        cls.rd.close()


class HappySqliteRedis(Happy, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rd = services.RedisServer()
        cls.redis = cls.rd.url

    @classmethod
    def tearDownClass(cls):
        cls.rd.close()


class HappyPostgres(Happy, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pg = services.PgServer()
        cls.store = cls.pg.url

    @classmethod
    def tearDownClass(cls):
        cls.pg.close()


class Idempotency(unittest.TestCase):
    def test_50_concurrent_one_key(self):
        with gwlib.Sim("--latency-ms", "300") as sim, \
                gwlib.Gateway([{"name": "sim", "type": "sim", "url": sim.url}]) as gw:
            key = gw.new_key("acme")
            body = {"template": "base", "metadata": {"k": "v"}}
            res = gwlib.parallel(lambda i: gw.create(key, body, idem="key-one"), 50)
            for r in res:
                self.assertNotIsInstance(r, Exception, r)
                self.assertIn(r.status, (200, 201), r)
            ids = {r.json["id"] for r in res}
            self.assertEqual(len(ids), 1, ids)
            self.assertEqual(sum(1 for r in res if r.status == 201), 1)
            sid = ids.pop()
            labelled = [x for x in sim.resources() if x.get("sandbox_id") == sid]
            self.assertEqual(len(labelled), 1, sim.resources())
            self.assertEqual(len(sim.resources()), 1)
            # same key, different body
            r = gw.create(key, dict(body, metadata={"k": "w"}), idem="key-one")
            self.assertEqual((r.status, r.code), (409, "idempotency_conflict"), r)
            # same key, same body, later: the same sandbox again
            r = gw.create(key, body, idem="key-one")
            self.assertEqual((r.status, r.json["id"]), (200, sid))
            # another tenant may use the same key independently
            other = gw.new_key("other")
            r = gw.create(other, body, idem="key-one")
            self.assertEqual(r.status, 201)
            self.assertNotEqual(r.json["id"], sid)

    def test_bad_idempotency_keys(self):
        with gwlib.Gateway(SIM) as gw:
            key = gw.new_key("acme")
            for bad in ("x" * 256, "has space", "tab\tkey"):
                r = gw.create(key, {}, idem=bad)
                self.assertEqual((r.status, r.code), (400, "invalid_request"), bad)
            self.assertEqual(gw.create(key, {}, idem="x" * 255).status, 201)


class Failover(unittest.TestCase):
    def test_burst_with_a_bad_provider(self):
        providers = [{"name": "bad", "type": "sim", "failure_rate": 0.63, "seed": 7, "latency_ms": 20},
                     {"name": "good", "type": "sim", "latency_ms": 20, "seed": 8}]
        with gwlib.Gateway(providers, cfg={"policy": {"strategy": "order"}}) as gw:
            key = gw.new_key("acme")
            res = gwlib.parallel(lambda i: gw.create(key, {"metadata": {"i": str(i)}}), 100)
            ok = [r for r in res if not isinstance(r, Exception) and r.status == 201]
            self.assertGreaterEqual(len(ok) / 100.0, 0.999, [r for r in res if r not in ok][:3])
            self.assertTrue(any(r.json["binding"]["provider"] == "good" for r in ok))
            self.assertTrue(any(r.json["binding"]["attempt"] > 1 for r in ok))
            pr = gw.req("GET", "/v1/providers", key=key).json["providers"]
            bad = [p for p in pr if p["name"] == "bad"][0]
            self.assertTrue(bad["health"]["timesOpened"] >= 1 or bad["health"]["breaker"] != "closed", bad)
            self.assertGreater(bad["health"]["createsFailed"], 0)
            m = gw.req("GET", "/metrics", key=gwlib.ADMIN_KEY)
            self.assertIn("osr_creates_total", m.raw)

    def test_all_providers_failed_and_no_capable_provider(self):
        providers = [{"name": "a", "type": "sim", "failure_rate": 1.0, "error": "capacity"},
                     {"name": "b", "type": "sim", "failure_rate": 1.0, "error": "unavailable"}]
        with gwlib.Gateway(providers) as gw:
            key = gw.new_key("acme")
            r = gw.create(key, {})
            self.assertEqual((r.status, r.code), (502, "all_providers_failed"), r)
            att = r.json["error"]["attempts"]
            self.assertEqual({a["provider"] for a in att}, {"a", "b"})
            for a in att:
                self.assertIn("error", a)
                self.assertIn("latencyMs", a)
            # the failed binding is recorded with its attempts
            failed = gw.list_all(key, "state=failed")
            self.assertEqual(len(failed), 1)
            # gpu asked, sims have none
            r = gw.create(key, {"capabilities": {"gpu": {"count": 1}}})
            self.assertEqual((r.status, r.code), (422, "no_capable_provider"), r)
            self.assertIn("providers", r.json["error"])
            self.assertIn("gpu", json.dumps(r.json["error"]["providers"]))
            # unknown provider in a pin → invalid_request
            r = gw.create(key, {"policy": {"strategy": "pin:nope"}})
            self.assertEqual((r.status, r.code), (400, "invalid_request"), r)

    def test_non_retryable_stops(self):
        providers = [{"name": "a", "type": "sim", "failure_rate": 1.0, "error": "auth"},
                     {"name": "b", "type": "sim"}]
        with gwlib.Gateway(providers, cfg={"policy": {"strategy": "order"}}) as gw:
            key = gw.new_key("acme")
            r = gw.create(key, {})
            self.assertEqual((r.status, r.code), (502, "all_providers_failed"), r)
            self.assertEqual([a["provider"] for a in r.json["error"]["attempts"]], ["a"])


class Errors(unittest.TestCase):
    def test_typed_errors_then_still_serving(self):
        with gwlib.Gateway(SIM) as gw:
            key = gw.new_key("acme")
            cases = [
                (b"{not json", 400, "invalid_request"),
                (b"[1,2]", 400, "invalid_request"),
                (json.dumps({"timeoutSeconds": "60"}).encode(), 400, "invalid_request"),
                (json.dumps({"timeoutSeconds": 0}).encode(), 400, "invalid_request"),
                (json.dumps({"timeoutSeconds": 10 ** 9}).encode(), 400, "invalid_request"),
                (json.dumps({"bogus": 1}).encode(), 400, "invalid_request"),
                (json.dumps({"capabilities": {"portz": [1]}}).encode(), 400, "invalid_request"),
                (json.dumps({"capabilities": {"ports": [0]}}).encode(), 400, "invalid_request"),
                (json.dumps({"capabilities": {"ports": list(range(1, 40))}}).encode(), 400, "invalid_request"),
                (json.dumps({"capabilities": {"isolation": "vm"}}).encode(), 400, "invalid_request"),
                (json.dumps({"capabilities": {"gpu": {"count": 65}}}).encode(), 400, "invalid_request"),
                (json.dumps({"template": "bad template!"}).encode(), 400, "invalid_request"),
                (json.dumps({"template": "t" * 128}).encode(), 400, "invalid_request"),
                (json.dumps({"env": {"A": 1}}).encode(), 400, "invalid_request"),
                (json.dumps({"metadata": {"k%d" % i: "v" for i in range(65)}}).encode(), 400, "invalid_request"),
                (json.dumps({"metadata": {"k": "v" * 4097}}).encode(), 400, "invalid_request"),
                (json.dumps({"policy": {"allow": ["nope"]}}).encode(), 400, "invalid_request"),
                (json.dumps({"policy": {"strategy": "fastest"}}).encode(), 400, "invalid_request"),
                (b"{" + b'"metadata":{"k":"' + b"v" * (2 << 20) + b'"}}', 413, "payload_too_large"),
            ]
            for raw, status, code in cases:
                r = gw.req("POST", "/v1/sandboxes", raw=raw, key=key)
                self.assertEqual((r.status, r.code), (status, code), raw[:80])
                self.assertTrue(r.json["error"]["message"])
            r = gw.req("POST", "/v1/sandboxes", raw=json.dumps({"bogus": 1}).encode(), key=key)
            self.assertIn("bogus", r.json["error"]["message"])
            self.assertEqual(gw.req("GET", "/v1/sandboxes", key="wrong").code, "unauthorized")
            self.assertEqual(gw.create(key, {}).status, 201)
            self.assertEqual(len(gw.list_all(key)), 1)


class Tenancy(unittest.TestCase):
    def test_isolation_between_tenants(self):
        with gwlib.Gateway(SIM) as gw:
            a, b = gw.new_key("tenant-a"), gw.new_key("tenant-b")
            sa = gw.create(a, {}).json["id"]
            sb = gw.create(b, {}).json["id"]
            self.assertEqual([s["id"] for s in gw.list_all(a)], [sa])
            self.assertEqual([s["id"] for s in gw.list_all(b)], [sb])
            for method, path, body in (("GET", "/v1/sandboxes/" + sb, None),
                                       ("DELETE", "/v1/sandboxes/" + sb, None),
                                       ("POST", "/v1/sandboxes/%s/timeout" % sb, {"timeoutSeconds": 5})):
                r = gw.req(method, path, body, key=a)
                self.assertEqual((r.status, r.code), (404, "not_found"), (method, r))
            self.assertEqual(gw.req("GET", "/v1/sandboxes/" + sb, key=b).json["state"], "running")
            # admin sees both, or one tenant with ?tenant=
            self.assertEqual({s["id"] for s in gw.list_all(gwlib.ADMIN_KEY)}, {sa, sb})
            self.assertEqual([s["id"] for s in gw.list_all(gwlib.ADMIN_KEY, "tenant=tenant-b")], [sb])


class Outages(unittest.TestCase):
    def test_redis_stopped_mid_run(self):
        with services.RedisServer() as rd, gwlib.Gateway(SIM, redis=rd.url) as gw:
            key = gw.new_key("acme")
            s = gw.create(key, {}).json["id"]
            gw.wait(lambda: rd.cli("exists", "osr:sb:" + s).strip() == "1" or
                    rd.cli("dbsize").strip() != "0", what="binding cached")
            rd.stop()
            for _ in range(5):
                r = gw.create(key, {})
                self.assertEqual(r.status, 201, r)
                self.assertEqual(gw.req("GET", "/v1/sandboxes/" + r.json["id"], key=key).status, 200)
            self.assertEqual(gw.req("GET", "/v1/sandboxes/" + s, key=key).status, 200)
            self.assertEqual(gw.req("DELETE", "/v1/sandboxes/" + s, key=key).status, 204)
            rd.start()
            gw.wait(lambda: gw.create(key, {}).status == 201, what="create after Redis is back")

    def test_postgres_stopped(self):
        with services.PgServer() as pg, services.RedisServer() as rd, \
                gwlib.Gateway(SIM, store=pg.url, redis=rd.url) as gw:
            key = gw.new_key("acme")
            s = gw.create(key, {}).json["id"]
            gw.wait(lambda: rd.cli("dbsize").strip() != "0", what="binding cached")
            self.assertEqual(gw.req("GET", "/v1/sandboxes/" + s, key=key).status, 200)
            pg.stop()
            t0 = time.time()
            r = gw.create(key, {}, timeout=10)
            took = time.time() - t0
            self.assertEqual((r.status, r.code), (503, "unavailable"), r)
            self.assertLess(took, 5.0)
            g = gw.req("GET", "/v1/sandboxes/" + s, key=key)
            self.assertEqual(g.status, 200, g)
            self.assertEqual(g.json["id"], s)
            pg.start()
            gw.wait(lambda: gw.create(key, {}).status == 201, timeout=30, what="create after PostgreSQL is back")


if __name__ == "__main__":
    osrtest.run()
