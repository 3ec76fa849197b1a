"""Binding tokens through the real osr-gateway (sim provider): the token in
a create answer verifies offline (tokcheck, built from the same token module
the data plane links) against GET /v1/keys/signing; POST
/v1/sandboxes/{id}/tokens with scopes, ports and lifetimes (expiry capped by
the sandbox's TTL); tenant isolation of that endpoint; the key directory
(created 0600 on first start, reused on restart, rotation, a broken key file
stops the gateway); and a kill publishing the invalidation on Redis, seen by
redis-cli SUBSCRIBE."""
import calendar
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "api"))
import gwlib  # noqa: E402
import osrtest  # noqa: E402
import services  # noqa: E402

TOKCHECK = os.environ.get("OSR_TOKCHECK", "")
SIM = [{"name": "sim", "type": "sim", "latency_ms": 5, "seed": 1}]


def ts(s):
    """RFC 3339 "2024-05-01T12:00:00.000Z" → unix seconds."""
    return calendar.timegm(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S"))


class Checker:
    """Offline verification with the gateway's published public keys."""

    def __init__(self, gw):
        r = gw.req("GET", "/v1/keys/signing")  # no Authorization: public
        assert r.status == 200, r
        self.doc = r.json
        fd, self.path = tempfile.mkstemp(prefix="osr-keys-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(r.json, f)

    def check(self, token, *extra):
        cp = subprocess.run([TOKCHECK, self.path, token] + [str(x) for x in extra],
                            capture_output=True, text=True, timeout=30)
        if cp.returncode == 2:
            raise AssertionError("tokcheck usage error: " + cp.stderr)
        return cp.returncode, json.loads(cp.stdout)

    def close(self):
        os.unlink(self.path)


class Create(unittest.TestCase):
    def test_create_token_verifies_offline(self):
        with gwlib.Gateway(SIM) as gw:
            key = gw.new_key("acme")
            r = gw.create(key, {"timeoutSeconds": 600})
            self.assertEqual(r.status, 201, r)
            s = r.json
            chk = Checker(gw)
            try:
                self.assertEqual(len(chk.doc["keys"]), 1)
                k = chk.doc["keys"][0]
                self.assertEqual(k["alg"], "Ed25519")
                self.assertRegex(k["pub"], r"^[0-9a-f]{64}$")
                self.assertEqual(chk.doc["active"], k["kid"])
                rc, out = chk.check(s["token"])
                self.assertEqual(rc, 0, out)
                c = out["claims"]
                self.assertEqual(c["sid"], s["id"])
                self.assertEqual(c["ten"], "acme")
                self.assertEqual(c["prv"], "sim")
                self.assertEqual(c["scopes"], ["exec", "files", "ports"])
                self.assertTrue(c["allPorts"])
                self.assertEqual(c["kid"], k["kid"])
                self.assertRegex(c["jti"], r"^[0-9a-f]{32}$")
                now = time.time()
                self.assertLessEqual(abs(c["iat"] - now), 30)
                # Default lifetime (3600 s) capped by the sandbox's 600 s TTL.
                self.assertEqual(c["exp"], ts(s["expiresAt"]))
                self.assertEqual(c["exp"], ts(s["tokenExpiresAt"]))
                self.assertLessEqual(c["exp"] - c["iat"], 600)
                # Access checks as the data plane makes them.
                rc, out = chk.check(s["token"], "--allows", s["id"], "exec", 0)
                self.assertEqual((rc, out["allows"]), (0, 0), out)
                rc, out = chk.check(s["token"], "--allows", s["id"], "ports", 12345)
                self.assertEqual(rc, 0, out)
                other = ("y" if s["id"][0] == "x" else "x") + s["id"][1:]  # never the same id
                rc, out = chk.check(s["token"], "--allows", other, "exec", 0)
                self.assertEqual((rc, out["allowsError"]), (1, "token is for another sandbox"))
                # Expired once past exp; a changed character is refused.
                rc, out = chk.check(s["token"], "--now", c["exp"])
                self.assertEqual((rc, out["error"]), (1, "token expired"))
                t = s["token"]
                bad = t[:20] + ("A" if t[20] != "A" else "B") + t[21:]
                rc, out = chk.check(bad)
                self.assertEqual(rc, 1)
                self.assertIn(out["error"], ("bad token signature", "malformed token"))
                # GET does not hand out tokens; the idempotent replay of the
                # create does (a fresh one).
                g = gw.req("GET", "/v1/sandboxes/" + s["id"], key=key)
                self.assertNotIn("token", g.json)
            finally:
                chk.close()

    def test_key_dir_created_and_reused(self):
        d = tempfile.mkdtemp(prefix="osr-gw-keys-")
        try:
            gw = gwlib.Gateway(SIM, data_dir=d)
            try:
                kdir = os.path.join(d, "keys")
                keys = [f for f in os.listdir(kdir) if f.endswith(".key")]
                self.assertEqual(len(keys), 1, os.listdir(kdir))
                st = os.stat(os.path.join(kdir, keys[0]))
                self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
                self.assertEqual(stat.S_IMODE(os.stat(kdir).st_mode), 0o700)
                with open(os.path.join(kdir, "active")) as f:
                    kid = f.read().strip()
                self.assertEqual(keys[0], kid + ".key")
                self.assertIn("signing with " + kid, gw.proc.stderr_text())
                key = gw.new_key("acme")
                tok = gw.create(key, {}).json["token"]
            finally:
                gw.close()
            # Restart: the same key signs, old tokens still verify.
            gw = gwlib.Gateway(SIM, data_dir=d)
            try:
                chk = Checker(gw)
                self.assertEqual([k["kid"] for k in chk.doc["keys"]], [kid])
                self.assertEqual(chk.check(tok)[0], 0)
                chk.close()
            finally:
                gw.close()
            # Rotation: a second key made active; both verify, the new one signs.
            with open(os.path.join(d, "keys", "k2.key"), "w") as f:
                f.write(os.urandom(32).hex() + "\n")
            os.chmod(os.path.join(d, "keys", "k2.key"), 0o600)
            with open(os.path.join(d, "keys", "active"), "w") as f:
                f.write("k2\n")
            gw = gwlib.Gateway(SIM, data_dir=d)
            try:
                chk = Checker(gw)
                self.assertEqual(sorted(k["kid"] for k in chk.doc["keys"]), sorted([kid, "k2"]))
                self.assertEqual(chk.doc["active"], "k2")
                self.assertEqual(chk.check(tok)[0], 0)
                key = gw.new_key("acme")
                tok2 = gw.create(key, {}).json["token"]
                rc, out = chk.check(tok2)
                self.assertEqual((rc, out["claims"]["kid"]), (0, "k2"))
                chk.close()
            finally:
                gw.close()
            # Retire the old key: its tokens fail closed.
            os.unlink(os.path.join(d, "keys", kid + ".key"))
            gw = gwlib.Gateway(SIM, data_dir=d)
            try:
                chk = Checker(gw)
                rc, out = chk.check(tok)
                self.assertEqual((rc, out["error"]), (1, "token signed by an unknown key"))
                self.assertEqual(chk.check(tok2)[0], 0)
                chk.close()
            finally:
                gw.close()
        finally:
            subprocess.run(["rm", "-rf", d])

    def test_keys_dir_config_and_broken_key(self):
        d = tempfile.mkdtemp(prefix="osr-gw-keys-")
        kdir = os.path.join(d, "elsewhere", "signing")
        try:
            gw = gwlib.Gateway(SIM, data_dir=d, cfg={"tokens": {"keys_dir": kdir, "ttl_seconds": 120}})
            try:
                self.assertTrue(any(f.endswith(".key") for f in os.listdir(kdir)))
                self.assertFalse(os.path.exists(os.path.join(d, "keys")))
                key = gw.new_key("acme")
                s = gw.create(key, {"timeoutSeconds": 3000}).json
                chk = Checker(gw)
                rc, out = chk.check(s["token"])
                self.assertEqual(rc, 0, out)
                self.assertEqual(out["claims"]["exp"] - out["claims"]["iat"], 120)
                chk.close()
            finally:
                gw.close()
            # A broken key file stops the start, naming the file.
            with open(os.path.join(kdir, "bad.key"), "w") as f:
                f.write("not hex\n")
            p = subprocess.run([gwlib.GATEWAY, "--listen", "127.0.0.1:0", "--data-dir", d, "--config",
                                os.path.join(d, "osr.yaml")],
                               env=dict(os.environ, OSR_ADMIN_KEY=gwlib.ADMIN_KEY),
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(os.path.join(kdir, "bad.key"), p.stderr)
        finally:
            subprocess.run(["rm", "-rf", d])


class Tokens(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gw = gwlib.Gateway(SIM)
        cls.key = cls.gw.new_key("acme")
        cls.chk = Checker(cls.gw)

    @classmethod
    def tearDownClass(cls):
        cls.chk.close()
        cls.gw.close()

    def post(self, sid, body, key=None):
        return self.gw.req("POST", "/v1/sandboxes/%s/tokens" % sid, body, key=key or self.key)

    def test_scopes_ports_ttl(self):
        s = self.gw.create(self.key, {"timeoutSeconds": 900}).json
        r = self.post(s["id"], {"scopes": ["exec"], "ttlSeconds": 60})
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json["scopes"], ["exec"])
        self.assertEqual(r.json["ports"], [])
        self.assertEqual(r.json["sandboxId"], s["id"])
        rc, out = self.chk.check(r.json["token"])
        self.assertEqual(rc, 0, out)
        c = out["claims"]
        self.assertEqual(c["scopes"], ["exec"])
        self.assertEqual(c["exp"] - c["iat"], 60)
        self.assertEqual(c["exp"], ts(r.json["expiresAt"]))
        self.assertEqual(c["jti"], r.json["tokenId"])
        self.assertEqual(self.chk.check(r.json["token"], "--allows", s["id"], "files", 0)[1]["allowsError"],
                         "scope not granted by the token")
        self.assertEqual(self.chk.check(r.json["token"], "--allows", s["id"], "ports", 80)[1]["allowsError"],
                         "scope not granted by the token")

        r = self.post(s["id"], {"scopes": ["ports", "files"], "ports": [8080, 3000]})
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json["scopes"], ["files", "ports"])
        self.assertEqual(r.json["ports"], [8080, 3000])
        tok = r.json["token"]
        rc, out = self.chk.check(tok)
        self.assertEqual(out["claims"]["ports"], [8080, 3000])
        self.assertFalse(out["claims"]["allPorts"])
        self.assertEqual(self.chk.check(tok, "--allows", s["id"], "ports", 3000)[0], 0)
        self.assertEqual(self.chk.check(tok, "--allows", s["id"], "ports", 3001)[1]["allowsError"],
                         "port not granted by the token")
        # Default lifetime: tokens.ttl_seconds (3600) capped by the 900 s TTL.
        self.assertEqual(out["claims"]["exp"], ts(s["expiresAt"]))

        # Empty body: everything, all ports.
        r = self.post(s["id"], None)
        self.assertEqual(r.status, 201, r)
        self.assertEqual((r.json["scopes"], r.json["ports"]), (["exec", "files", "ports"], "all"))
        r = self.post(s["id"], {"scopes": ["ports"], "ports": "all"})
        self.assertEqual((r.status, r.json["ports"]), (201, "all"), r)

    def test_expiry_never_beyond_sandbox_ttl(self):
        s = self.gw.create(self.key, {"timeoutSeconds": 30}).json
        r = self.post(s["id"], {"ttlSeconds": 86400})
        self.assertEqual(r.status, 201, r)
        self.assertEqual(ts(r.json["expiresAt"]), ts(s["expiresAt"]))
        c = self.chk.check(r.json["token"])[1]["claims"]
        self.assertLessEqual(c["exp"], ts(s["expiresAt"]))
        self.assertLessEqual(c["exp"] - c["iat"], 30)
        # Extending the sandbox lets new tokens live longer (old ones keep theirs).
        t = self.gw.req("POST", "/v1/sandboxes/%s/timeout" % s["id"], {"timeoutSeconds": 600}, key=self.key)
        self.assertEqual(t.status, 200, t)
        r2 = self.post(s["id"], {"ttlSeconds": 300})
        c2 = self.chk.check(r2.json["token"])[1]["claims"]
        self.assertEqual(c2["exp"] - c2["iat"], 300)

    def test_bad_requests(self):
        s = self.gw.create(self.key, {}).json
        for body in ({"scopes": []}, {"scopes": ["root"]}, {"scopes": ["exec", "exec"]}, {"scopes": "exec"},
                     {"scopes": ["exec"], "ports": [80]}, {"ports": [0]}, {"ports": [70000]},
                     {"ports": list(range(1, 34))}, {"ports": "some"}, {"ports": []},
                     {"ttlSeconds": 0}, {"ttlSeconds": -5}, {"ttlSeconds": 10 ** 9}, {"ttlSeconds": "60"},
                     {"scope": ["exec"]}):
            r = self.post(s["id"], body)
            self.assertEqual((r.status, r.code), (400, "invalid_request"), (body, r))
        r = self.gw.req("POST", "/v1/sandboxes/%s/tokens" % s["id"], raw=b"[1]", key=self.key)
        self.assertEqual(r.status, 400, r)
        # Unknown sandbox; a killed one.
        self.assertEqual(self.post("nosuchsandbox0000000", {}).status, 404)
        self.assertEqual(self.gw.req("DELETE", "/v1/sandboxes/" + s["id"], key=self.key).status, 204)
        r = self.post(s["id"], {})
        self.assertEqual((r.status, r.code), (409, "conflict"), r)

    def test_audited_without_the_token(self):
        s = self.gw.create(self.key, {}).json
        r = self.post(s["id"], {"scopes": ["files"], "ttlSeconds": 120})
        self.assertEqual(r.status, 201, r)

        def find():
            a = self.gw.req("GET", "/v1/audit?limit=1000", key=self.key)
            assert a.status == 200, a
            items = a.json.get("items", a.json.get("events", []))
            return [e for e in items if e.get("action") == "token" and e.get("sandboxId", e.get("sandbox_id")) == s["id"]]

        ev = self.gw.wait(find, what="the token audit event")
        self.assertNotIn(r.json["token"], json.dumps(ev))
        self.assertIn(r.json["tokenId"], json.dumps(ev))
        self.assertIn("files", json.dumps(ev))


class Tenancy(unittest.TestCase):
    def test_tokens_are_tenant_scoped(self):
        with gwlib.Gateway(SIM) as gw:
            a, b = gw.new_key("acme"), gw.new_key("globex")
            s = gw.create(a, {}).json
            path = "/v1/sandboxes/%s/tokens" % s["id"]
            r = gw.req("POST", path, {}, key=b)
            self.assertEqual((r.status, r.code), (404, "not_found"), r)
            self.assertNotIn("token", r.json)
            r = gw.req("POST", path, {})
            self.assertEqual(r.status, 401, r)
            r = gw.req("POST", path, {}, key="osr_" + "0" * 40)
            self.assertEqual(r.status, 401, r)
            self.assertEqual(gw.req("POST", path, {}, key=a).status, 201)
            # The admin may mint for any tenant's sandbox; the claims name the owner.
            r = gw.req("POST", path, {"scopes": ["exec"]}, key=gwlib.ADMIN_KEY)
            self.assertEqual(r.status, 201, r)
            chk = Checker(gw)
            self.assertEqual(chk.check(r.json["token"])[1]["claims"]["ten"], "acme")
            chk.close()
            # The key endpoint needs no key, and takes no other method.
            self.assertEqual(gw.req("GET", "/v1/keys/signing").status, 200)
            self.assertEqual(gw.req("POST", "/v1/keys/signing", {}, key=gwlib.ADMIN_KEY).status, 405)


class Revocation(unittest.TestCase):
    def test_kill_publishes_invalidation(self):
        with services.RedisServer() as rd, gwlib.Gateway(SIM, redis=rd.url) as gw:
            key = gw.new_key("acme")
            s = gw.create(key, {}).json
            # redis-cli prints each reply element on its own line (raw mode,
            # stdout being a pipe): "subscribe", channel, count, then for
            # every publish "message", channel, payload.
            sub = osrtest.Proc(["redis-cli", "-p", str(rd.port), "SUBSCRIBE", "osr:invalidate"])
            try:
                sub.wait_line("osr:invalidate", timeout=10)  # subscribed
                # The gateway's Redis connection comes up in the background.
                gw.wait(lambda: re.search(r"\[redis\] connected", gw.proc.stderr_text()), what="redis")
                other = gw.create(key, {}).json
                t0 = time.time()
                r = gw.req("DELETE", "/v1/sandboxes/" + s["id"], key=key)
                self.assertEqual(r.status, 204, r)
                sub.wait_line(s["id"], timeout=5)
                # Well within the data plane's one-second revocation budget
                # (generous here: sanitizer builds are slow).
                self.assertLess(time.time() - t0, 5)
                self.assertFalse(any(ln.startswith(other["id"]) for ln in sub.lines))
            finally:
                sub.stop()


if __name__ == "__main__":
    osrtest.run()
