"""Data-plane activity -> idle timeouts, agent endpoint refresh and the data
plane's /metrics (docs/dataplane.md, "Activity", "Endpoint refresh",
"Metrics").

Standalone: osr-gateway (sim provider, real Redis, reaper every 500 ms) and
osr-dataplane (the gateway's keys, the same Redis, reports every 500 ms) in
front of real osr-agents. The sandbox's token is minted for the gateway's
sandbox id with the gateway's own key (dp-mint) but names a real agent, so
requests really stream. Idle timeout 3 s: traffic for 7 s must keep it
alive, which fails if reports are not delivered (it would be reaped ~3.5 s
after create), and once the traffic stops it must end "idle" in bounded
time.

HttpFallback: the same without Redis, reports through POST
/v1/internal/activity with the admin key.

Embedded: `osr serve` with the local provider (a real sandbox), reports in
process.

EndpointRefresh: the binding cache entry the gateway wrote is rewritten to
point at another agent (as a resume would) and the first agent is stopped:
new requests must reach the second one."""
import http.client
import json
import os
import re
import shutil
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "api"))
sys.path.insert(0, os.path.join(HERE, "..", "local"))
import gwlib  # noqa: E402
import osrtest  # noqa: E402
import services  # noqa: E402

DP = os.environ.get("OSR_DATAPLANE", "")
AGENT = os.environ.get("OSR_AGENT", "")
MINT = os.environ.get("OSR_DP_MINT", "")
CLI = os.environ.get("OSR_CLI", "")
ENVD = 49983
IDLE_S = 3
REAPER_MS = 500
FLUSH_MS = 500
# Destruction after the last request: idle + one reaper interval + one
# report interval, plus slack for a loaded CI machine (store writes, the
# provider's destroy). Not a performance assertion: the failure it catches
# is "never reaped" or "reaped on a different rule".
KILL_BOUND_S = IDLE_S + (REAPER_MS + FLUSH_MS) / 1000.0 + 8


def dp_request(port, sid, tok, path="/health", method="GET", timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(ENVD),
                                         "X-Access-Token": tok})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def dp_metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def metric(text, name):
    m = re.search(r"^%s (\d+)$" % re.escape(name), text, re.M)
    return int(m.group(1)) if m else None


class Agent:
    def __init__(self, d, name):
        self.sock = os.path.join(d, name + ".sock")
        self.ep = "unix:" + self.sock
        self.proc = osrtest.Proc([AGENT, "--listen", self.ep, "--workdir", d])
        self.proc.wait_line("ready")

    def stop(self):
        if self.proc.alive():
            self.proc.stop()


class Base(unittest.TestCase):
    """osr-gateway + osr-dataplane + Redis (+ agents)."""

    use_redis = True

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="osr-act-")
        self.redis = services.RedisServer() if self.use_redis else None
        self.gw = None
        self.dp = None
        self.agents = []
        try:
            self.gw = gwlib.Gateway([{"name": "sim", "type": "sim", "latency_ms": 5}],
                                    redis=self.redis.url if self.redis else None,
                                    cfg={"reaper": {"interval_ms": REAPER_MS}})
            self.key = self.gw.new_key("acme")
            self.agents.append(Agent(self.dir, "a"))
            self.start_dp()
        except Exception:
            self.tearDown()
            raise

    def start_dp(self, *extra):
        keys = os.path.join(self.gw.dir, "keys")
        args = [DP, "--listen", "127.0.0.1:0", "--keys-dir", keys, "--activity-interval-ms",
                str(FLUSH_MS), "--endpoint-ttl-ms", "300", "--log-level", "info"]
        if self.redis is not None:
            args += ["--redis", self.redis.url]
        else:
            kf = os.path.join(self.dir, "gw.key")
            with open(kf, "w") as f:
                f.write(gwlib.ADMIN_KEY + "\n")
            args += ["--gateway-url", self.gw.base, "--gateway-key-file", kf]
        self.dp = osrtest.Proc(args + list(extra))
        ln = self.dp.wait_line("listening 127.0.0.1:0 ")
        self.port = int(ln.split()[-1])
        self.dp.wait_line("ready")

    def tearDown(self):
        if self.dp is not None and self.dp.alive():
            rc = self.dp.stop()
            if rc != 0:
                print(self.dp.stderr_text()[-4000:], file=sys.stderr)
        for a in self.agents:
            a.stop()
        if self.gw is not None:
            self.gw.close()
        if self.redis is not None:
            self.redis.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def gw_token(self, sid, ep):
        """A token for the gateway's sandbox, signed with the gateway's own
        active key, naming a real agent instead of the sim's placeholder."""
        keys = os.path.join(self.gw.dir, "keys")
        kids = sorted(f[:-4] for f in os.listdir(keys) if f.endswith(".key"))
        active = os.path.join(keys, "active")
        kid = open(active).read().strip() if os.path.exists(active) else kids[-1]
        return osrtest.sh([MINT, "sign", keys, kid, sid, ep, "exec,files,ports", "all",
                           "600"]).stdout.decode().strip()

    def point_cache(self, sid, ep):
        """Rewrite the binding the gateway cached in Redis to name `ep` (what
        a resume on another host does). With Redis the data plane follows
        the cache, so the sim's placeholder endpoint must be replaced."""
        self.get(sid)  # the gateway caches bindings it reads
        key = "osr:b:" + sid
        raw = ""
        for _ in range(50):
            raw = self.redis.cli("GET", key).strip()
            if raw:
                break
            time.sleep(0.1)
        self.assertTrue(raw, "the gateway did not cache the binding")
        doc = json.loads(raw)
        doc["agent_endpoint"] = ep
        self.redis.cli("SET", key, json.dumps(doc), "PX", "600000")

    def get(self, sid):
        r = self.gw.req("GET", "/v1/sandboxes/" + sid, key=self.key)
        self.assertEqual(r.status, 200, r)
        return r.json

    def check_idle_cycle(self, sid, tok):
        created = self.get(sid)
        self.assertEqual(created["state"], "running")
        # Traffic for more than twice the idle timeout.
        t0 = time.time()
        n = 0
        while time.time() - t0 < 2 * IDLE_S + 1:
            st, body = dp_request(self.port, sid, tok)
            self.assertEqual(st, 204, body)  # the agent's /health
            n += 1
            time.sleep(0.25)
        g = self.get(sid)
        self.assertEqual(g["state"], "running",
                         "reaped while traffic was flowing (reports not delivered?): %r" % g)
        self.assertIsNotNone(g.get("lastActivityAt"), g)
        self.assertGreater(g["lastActivityAt"], created["lastActivityAt"] or "", g)
        # Silence: it must end as idle, within the bound.
        quiet = time.time()
        end = None
        while time.time() - quiet < KILL_BOUND_S + 5:
            g = self.get(sid)
            if g["state"] != "running":
                end = time.time()
                break
            time.sleep(0.2)
        self.assertIsNotNone(end, "never reaped after the traffic stopped: %r" % g)
        self.assertEqual(g["state"], "ended", g)
        self.assertEqual(g["endReason"], "idle", g)
        self.assertGreaterEqual(end - quiet, IDLE_S - FLUSH_MS / 1000.0 - 0.5,
                                "reaped before the idle timeout ran out")
        self.assertLessEqual(end - quiet, KILL_BOUND_S)
        return n

    def idle_timeout_follows_traffic(self):
        r = self.gw.create(self.key, {"timeoutSeconds": 600, "idleTimeoutSeconds": IDLE_S})
        self.assertEqual(r.status, 201, r)
        sid = r.json["id"]
        tok = self.gw_token(sid, self.agents[0].ep)
        if self.redis is not None:
            self.point_cache(sid, self.agents[0].ep)
        # The control: a sandbox nobody talks to is reaped as idle meanwhile.
        other = self.gw.create(self.key, {"timeoutSeconds": 600,
                                          "idleTimeoutSeconds": IDLE_S}).json["id"]
        self.check_idle_cycle(sid, tok)
        self.assertEqual(self.get(other)["endReason"], "idle")

        st, text = dp_metrics(self.port)
        self.assertEqual(st, 200)
        self.assertGreater(metric(text, 'osr_dataplane_requests_total{kind="envd",class="2xx"}') or 0,
                           10, text)
        self.assertGreater(metric(text, 'osr_dataplane_activity_reports_total{result="ok"}') or 0, 3,
                           text)


class Standalone(Base):
    def test_idle_timeout_follows_traffic(self):
        self.idle_timeout_follows_traffic()


class HttpFallback(Base):
    """No Redis: reports go to POST /v1/internal/activity."""

    use_redis = False

    def test_idle_timeout_follows_traffic(self):
        self.idle_timeout_follows_traffic()

    def test_internal_endpoint_needs_admin_key(self):
        body = {"activity": [{"id": "abc", "at": 1}]}
        r = self.gw.req("POST", "/v1/internal/activity", body, key=self.key)
        self.assertEqual(r.status, 403, r)
        r = self.gw.req("POST", "/v1/internal/activity", {"activity": [{"id": "A/B", "at": 1}]},
                        key=gwlib.ADMIN_KEY)
        self.assertEqual(r.status, 400, r)
        r = self.gw.req("POST", "/v1/internal/activity", body, key=gwlib.ADMIN_KEY)
        self.assertEqual(r.status, 204, r)


class Metrics(Base):
    def test_counters_move(self):
        st, before = dp_metrics(self.port)
        self.assertEqual(st, 200)
        self.assertIn("# TYPE osr_dataplane_requests_total counter", before)
        miss0 = metric(before, 'osr_dataplane_auth_failures_total{reason="missing"}')
        sig0 = metric(before, 'osr_dataplane_auth_failures_total{reason="malformed"}')
        sid = self.gw.create(self.key, {"timeoutSeconds": 600}).json["id"]
        tok = self.gw_token(sid, self.agents[0].ep)
        self.point_cache(sid, self.agents[0].ep)
        self.assertEqual(dp_request(self.port, sid, tok)[0], 204)
        # A body both ways: the agent's file API.
        path = os.path.join(self.dir, "m.txt")
        with open(path, "wb") as f:
            f.write(b"x" * 1000)
        st, body = dp_request(self.port, sid, tok, path="/files?path=" + path)
        self.assertEqual((st, body), (200, b"x" * 1000))
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("GET", "/health", headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(ENVD)})
        self.assertEqual(c.getresponse().status, 401)
        c.close()
        self.assertEqual(dp_request(self.port, sid, "garbage")[0], 401)
        # an agent that is not there (the cache says so): an upstream error
        self.point_cache(sid, "unix:" + os.path.join(self.dir, "nothing.sock"))
        st = None
        for _ in range(100):
            st = dp_request(self.port, sid, tok)[0]
            if st == 502:
                break
            time.sleep(0.05)
        self.assertEqual(st, 502)
        st, after = dp_metrics(self.port)
        self.assertEqual(metric(after, 'osr_dataplane_auth_failures_total{reason="missing"}'), miss0 + 1)
        self.assertEqual(metric(after, 'osr_dataplane_auth_failures_total{reason="malformed"}'),
                         sig0 + 1)
        self.assertGreaterEqual(metric(after, "osr_dataplane_upstream_errors_total"), 1)
        self.assertGreaterEqual(
            metric(after, 'osr_dataplane_requests_total{kind="envd",class="2xx"}'), 1)
        self.assertGreaterEqual(
            metric(after, 'osr_dataplane_requests_total{kind="envd",class="5xx"}'), 1)
        self.assertIsNotNone(metric(after, "osr_dataplane_connections"))
        self.assertEqual(metric(after, "osr_dataplane_tunnels"), 0)
        self.assertGreaterEqual(metric(after, "osr_dataplane_bytes_out_total"), 1000)


class EndpointRefresh(Base):
    def test_new_connections_follow_the_cache(self):
        self.agents.append(Agent(self.dir, "b"))
        a, b = self.agents
        sid = self.gw.create(self.key, {"timeoutSeconds": 600}).json["id"]
        self.point_cache(sid, a.ep)
        tok = self.gw_token(sid, a.ep)
        self.assertEqual(dp_request(self.port, sid, tok)[0], 204)
        # A resume elsewhere: the cache now says B.
        self.point_cache(sid, b.ep)
        a.stop()  # only B can answer from now on
        ok = False
        deadline = time.time() + 10
        while time.time() < deadline:
            if dp_request(self.port, sid, tok)[0] == 204:
                ok = True
                break
            time.sleep(0.1)
        self.assertTrue(ok, "requests never reached the endpoint in the cache:\n" +
                        self.dp.stderr_text()[-3000:])
        # ... and keep going there.
        for _ in range(5):
            self.assertEqual(dp_request(self.port, sid, tok)[0], 204)
        st, text = dp_metrics(self.port)
        self.assertGreaterEqual(metric(text, 'osr_dataplane_endpoint_lookups_total{result="ok"}'), 1)


class Embedded(unittest.TestCase):
    """osr serve with the local provider: reports go straight to the store."""

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("the local provider needs root")
        from test_local import runtime_problem  # noqa: E402
        classes = [c for c in ("container", "gvisor") if runtime_problem(c) is None]
        if not classes:
            self.skipTest("the local provider cannot run here")
        self.cls = classes[0]
        self.dir = tempfile.mkdtemp(prefix="osr-act-serve-")
        cfg = os.path.join(self.dir, "osr.yaml")
        with open(cfg, "w") as f:
            json.dump({"reaper": {"interval_ms": REAPER_MS}}, f)
        self.dp_port = services.free_port()
        env = {"OSR_DATA_DIR": self.dir, "OSR_PROVIDERS": "local", "OSR_ADMIN_KEY": gwlib.ADMIN_KEY,
               "OSR_ACTIVITY_INTERVAL_MS": str(FLUSH_MS)}
        for k in ("OSR_LISTEN", "OSR_STORE", "OSR_REDIS", "OSR_CONFIG", "OSR_DATAPLANE_LISTEN"):
            os.environ.pop(k, None)
        self.proc = osrtest.Proc([CLI, "serve", "--listen", "127.0.0.1:0", "--dataplane-listen",
                                  "127.0.0.1:%d" % self.dp_port, "--config", cfg,
                                  "--log-level", "info"], env=env)
        self.sid = None
        end = time.time() + 60
        self.port = None
        while time.time() < end and self.port is None:
            m = re.search(r"listening on \S+ \(port (\d+)", self.proc.stderr_text())
            if m:
                self.port = int(m.group(1))
            elif not self.proc.alive():
                break
            time.sleep(0.05)
        if self.port is None:
            self.tearDown()
            raise AssertionError("osr serve did not start:\n" + self.proc.stderr_text())
        for _ in range(600):
            if "data plane serving" in self.proc.stderr_text() or not self.proc.alive():
                break
            time.sleep(0.05)

    def tearDown(self):
        if self.sid is not None:
            try:
                self.api("DELETE", "/v1/sandboxes/" + self.sid)
            except Exception:  # noqa: BLE001 - best effort
                pass
        if self.proc.alive():
            rc = self.proc.stop()
            if rc != 0:
                print(self.proc.stderr_text()[-4000:], file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)

    def api(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        h = {"Authorization": "Bearer " + gwlib.ADMIN_KEY}
        data = None
        if body is not None:
            data = json.dumps(body)
            h["Content-Type"] = "application/json"
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, json.loads(raw) if raw else None

    def test_idle_timeout_follows_traffic(self):
        st, b = self.api("POST", "/v1/sandboxes", {"capabilities": {"isolation": self.cls},
                                                   "timeoutSeconds": 600,
                                                   "idleTimeoutSeconds": IDLE_S})
        self.assertEqual(st, 201, b)
        self.sid = sid = b["id"]
        tok = b["token"]
        t0 = time.time()
        while time.time() - t0 < 2 * IDLE_S + 1:
            st, body = dp_request(self.dp_port, sid, tok)
            self.assertEqual(st, 204, body)  # the agent's /health
            time.sleep(0.25)
        st, g = self.api("GET", "/v1/sandboxes/" + sid)
        self.assertEqual(g["state"], "running", "reaped while traffic was flowing: %r" % g)
        quiet = time.time()
        while time.time() - quiet < KILL_BOUND_S + 5:
            st, g = self.api("GET", "/v1/sandboxes/" + sid)
            if g["state"] != "running":
                break
            time.sleep(0.2)
        elapsed = time.time() - quiet
        self.assertEqual(g["state"], "ended", g)
        self.assertEqual(g["endReason"], "idle", g)
        self.assertLessEqual(elapsed, KILL_BOUND_S)
        self.sid = None


if __name__ == "__main__":
    osrtest.run()
