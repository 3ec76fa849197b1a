"""The E2B-compatible front door (src/gateway/api_e2b.c, docs/e2b-compat.md)
against a real `osr serve` on the sim provider: the real e2b JS SDK (2.51.0,
and 2.7.0, which creates through POST /sandboxes) driving create, getInfo,
list with a metadata filter and pagination, setTimeout, connect, kill and the
error paths (e2b_rest.js), plus the wire details the SDK relies on, checked
with raw HTTP: error bodies {"code":<status>,...}, X-API-KEY and Bearer,
e2b_ keys, the domain, OSR extras, pause/metrics."""
import http.client
import json
import os
import re
import shutil
import tempfile
import time
import unittest
import urllib.parse

import osrtest

CLI = os.environ.get("OSR_CLI", "")
ADMIN = "osr-admin-e2b-test-0123456789abcdef"
HERE = os.path.dirname(os.path.abspath(__file__))


class Serve:
    """`osr serve` on 127.0.0.1:0 with the sim provider and a temp data dir."""

    def __init__(self, env=None, cfg=None, args=None):
        self.dir = tempfile.mkdtemp(prefix="osr-e2b-")
        e = {"OSR_PROVIDERS": "sim", "OSR_ADMIN_KEY": ADMIN}
        e.update(env or {})
        # The embedded data plane on port 0: never two servers on 7071.
        argv = [CLI, "serve", "--listen", "127.0.0.1:0", "--dataplane-listen", "127.0.0.1:0",
                "--data-dir", self.dir]
        argv += args or []
        if cfg is not None:
            path = os.path.join(self.dir, "osr.yaml")
            with open(path, "w") as f:
                json.dump(cfg, f)  # JSON is YAML
            argv += ["--config", path]
        self.proc = osrtest.Proc(argv, env=e)
        end = time.time() + 30
        while time.time() < end:
            m = re.search(r"listening on \S+ \(port (\d+)", self.proc.stderr_text())
            if m:
                self.port = int(m.group(1))
                return
            if not self.proc.alive():
                break
            time.sleep(0.05)
        text = self.proc.stderr_text()
        self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        raise AssertionError("osr serve did not start:\n" + text)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.proc.stop()
        text = self.proc.stderr_text()
        shutil.rmtree(self.dir, ignore_errors=True)
        if rc != 0:
            raise AssertionError("osr serve exited with %s:\n%s" % (rc, text[-4000:]))

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def request(self, method, path, body=None, headers=None, chunked=False):
        """(status, headers dict lower-cased, parsed JSON or raw text or None)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            h = dict(headers or {})
            data = None
            if body is not None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                h.setdefault("Content-Type", "application/json")
            if chunked and data is not None:
                # As the SDK sends JSON: chunked, no Content-Length.
                c.putrequest(method, path)
                for k, v in h.items():
                    c.putheader(k, v)
                c.putheader("Transfer-Encoding", "chunked")
                c.endheaders()
                half = len(data) // 2
                for part in (data[:half], data[half:]):
                    if part:
                        c.send(b"%x\r\n%s\r\n" % (len(part), part))
                c.send(b"0\r\n\r\n")
            else:
                c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            raw = r.read()
            hd = {k.lower(): v for k, v in r.getheaders()}
            val = None
            if raw:
                try:
                    val = json.loads(raw)
                except ValueError:
                    val = raw.decode("utf-8", "replace")
            return r.status, hd, val
        finally:
            c.close()

    def new_key(self, tenant, fmt="e2b"):
        st, _, j = self.request("POST", "/v1/keys", {"tenant": tenant, "format": fmt},
                                {"Authorization": "Bearer " + ADMIN})
        assert st == 201, (st, j)
        return j["key"]


def run_sdk(test, module):
    nm = osrtest.node_modules()
    if not os.path.isdir(os.path.join(nm, module)):
        test.fail("npm %s is not installed: run npm ci --prefix tests" % module)
    with Serve() as srv:
        key = srv.new_key("sdk-" + module)
        test.assertRegex(key, r"^e2b_[0-9a-f]{40}$")
        env = {"E2B_API_URL": srv.url, "E2B_API_KEY": key, "OSR_E2B_MODULE": module}
        cp = osrtest.sh(["node", os.path.join(HERE, "e2b_rest.js")], env=env, timeout=180, check=False)
        out = cp.stdout.decode("utf-8", "replace")
        err = cp.stderr.decode("utf-8", "replace")
        test.assertEqual(cp.returncode, 0, out + err + "\ngateway:\n" + srv.proc.stderr_text()[-3000:])
        test.assertIn("E2B-REST-OK " + module, out)


class SdkLatest(unittest.TestCase):
    def test_sdk_2_51(self):
        run_sdk(self, "e2b")


class Sdk27(unittest.TestCase):
    def test_sdk_2_7(self):
        run_sdk(self, "e2b-2_7")


def is_e2b_error(test, st, hd, j, status):
    test.assertEqual(st, status, j)
    test.assertTrue(hd.get("content-type", "").startswith("application/json"), hd)
    test.assertIsInstance(j, dict, j)
    test.assertEqual(j.get("code"), status, j)
    test.assertIsInstance(j.get("message"), str, j)


class Rest(unittest.TestCase):
    """The wire contract, request by request."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Serve(env={"OSR_E2B_DOMAIN": "sbx.osr.test:8443"})
        cls.key = cls.srv.new_key("rest")
        cls.h = {"X-API-KEY": cls.key}

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    def create(self, body, path="/v2/sandboxes", headers=None, chunked=True):
        h = dict(self.h)
        h.update(headers or {})
        return self.srv.request("POST", path, body, h, chunked=chunked)

    def test_create_shape_both_paths(self):
        for path in ("/v2/sandboxes", "/sandboxes"):
            st, hd, j = self.create({"templateID": "base", "metadata": {"k": "v"}, "envVars": {"A": "1"},
                                     "timeout": 120, "secure": True, "allow_internet_access": False,
                                     "autoPause": False, "mcp": None}, path)
            self.assertEqual(st, 201, j)
            self.assertRegex(j["sandboxID"], r"^[a-z0-9]{20}$")
            self.assertEqual(j["templateID"], "base")
            self.assertEqual(j["clientID"], "sim")
            self.assertEqual(j["envdVersion"], "0.5.7")
            self.assertEqual(j["domain"], "sbx.osr.test:8443")
            self.assertTrue(j["envdAccessToken"].startswith("osr1."), j)
            # The detail reports the recorded E2B-only fields; metadata hides them.
            st, _, d = self.srv.request("GET", "/sandboxes/" + j["sandboxID"], headers=self.h)
            self.assertEqual(st, 200, d)
            self.assertEqual(d["metadata"], {"k": "v"})
            self.assertIs(d["allowInternetAccess"], False)
            self.assertEqual(d["lifecycle"]["onTimeout"], "kill")
            self.assertEqual(d["domain"], "sbx.osr.test:8443")
            for f in ("sandboxID", "templateID", "clientID", "startedAt", "endAt", "state", "cpuCount",
                      "memoryMB", "diskSizeMB", "envdVersion"):
                self.assertIn(f, d)
            # The OSR view of the same sandbox keeps them under osr.e2b.
            st, _, o = self.srv.request("GET", "/v1/sandboxes/" + j["sandboxID"],
                                        headers={"Authorization": "Bearer " + self.key})
            self.assertEqual(st, 200, o)
            self.assertEqual(json.loads(o["metadata"]["osr.e2b"])["allowInternetAccess"], False)
            self.assertEqual(o["template"], "base")

    def test_default_timeout_is_300(self):
        st, _, j = self.create({"templateID": "base"})
        self.assertEqual(st, 201, j)
        st, _, d = self.srv.request("GET", "/sandboxes/" + j["sandboxID"], headers=self.h)
        t0 = time.strptime(d["startedAt"][:19], "%Y-%m-%dT%H:%M:%S")
        t1 = time.strptime(d["endAt"][:19], "%Y-%m-%dT%H:%M:%S")
        life = time.mktime(t1) - time.mktime(t0)
        self.assertTrue(298 <= life <= 302, life)

    def test_osr_extras(self):
        # A capability no sim provider has: placement refuses, 422 in E2B shape.
        st, hd, j = self.create({"templateID": "base", "osr": {"capabilities": {"gpu": 8}}})
        is_e2b_error(self, st, hd, j, 422)
        st, hd, j = self.create({"templateID": "base"}, headers={"X-OSR-Capabilities": '{"gpu": 8}'})
        is_e2b_error(self, st, hd, j, 422)
        st, hd, j = self.create({"templateID": "base"}, headers={"X-OSR-Policy": '{"strategy": "pin:nope"}'})
        is_e2b_error(self, st, hd, j, 400)
        st, hd, j = self.create({"templateID": "base"}, headers={"X-OSR-Policy": "not json"})
        is_e2b_error(self, st, hd, j, 400)
        st, _, j = self.create({"templateID": "base", "osr": {"policy": {"strategy": "cost"}}})
        self.assertEqual(st, 201, j)

    def test_bad_bodies(self):
        for body in ({"templateID": 5}, {"timeout": "x"}, {"metadata": {"osr.e2b": "x"}},
                     {"metadata": {"k": 1}}, {"timeout": 10 ** 9}):
            st, hd, j = self.create(body)
            is_e2b_error(self, st, hd, j, 400)
        st, hd, j = self.create(b"{nope", chunked=False)
        is_e2b_error(self, st, hd, j, 400)

    def test_auth(self):
        for h in ({}, {"X-API-KEY": "e2b_" + "0" * 40}, {"X-API-KEY": "nonsense"},
                  {"Authorization": "Bearer e2b_" + "1" * 40}):
            st, hd, j = self.srv.request("GET", "/v2/sandboxes", headers=h)
            is_e2b_error(self, st, hd, j, 401)
        st, _, j = self.srv.request("GET", "/v2/sandboxes", headers={"Authorization": "Bearer " + self.key})
        self.assertEqual(st, 200, j)
        # An osr_ key works on the E2B routes, an e2b_ key on OSR's.
        okey = self.srv.new_key("rest", fmt="osr")
        self.assertRegex(okey, r"^osr_[0-9a-f]{40}$")
        st, _, j = self.srv.request("GET", "/v2/sandboxes", headers={"X-API-KEY": okey})
        self.assertEqual(st, 200, j)
        st, _, j = self.srv.request("GET", "/v1/sandboxes", headers={"X-API-KEY": self.key})
        self.assertEqual(st, 200, j)
        st, _, j = self.srv.request("POST", "/v1/keys", {"tenant": "x", "format": "aws"},
                                    {"Authorization": "Bearer " + ADMIN})
        self.assertEqual(st, 400, j)

    def test_tenancy(self):
        st, _, j = self.create({"templateID": "base"})
        sid = j["sandboxID"]
        other = {"X-API-KEY": self.srv.new_key("rest-other")}
        for m, p in (("GET", "/sandboxes/" + sid), ("DELETE", "/sandboxes/" + sid),
                     ("POST", "/sandboxes/" + sid + "/connect"), ("GET", "/sandboxes/" + sid + "/metrics")):
            st, hd, j = self.srv.request(m, p, {} if m == "POST" else None, other)
            is_e2b_error(self, st, hd, j, 404)
        st, _, j = self.srv.request("GET", "/v2/sandboxes", headers=other)
        self.assertNotIn(sid, [x["sandboxID"] for x in j])

    def test_unknown_and_ended(self):
        for m, p in (("GET", "/sandboxes/aaaaaaaaaaaaaaaaaaaa"), ("DELETE", "/sandboxes/aaaaaaaaaaaaaaaaaaaa"),
                     ("DELETE", "/sandboxes/not-an-osr-id"), ("POST", "/sandboxes/x_y/timeout"),
                     ("GET", "/sandboxes/aaaaaaaaaaaaaaaaaaaa/metrics"), ("GET", "/v2/nothing")):
            st, hd, j = self.srv.request(m, p, {"timeout": 5} if m == "POST" else None, self.h)
            is_e2b_error(self, st, hd, j, 404)
        st, hd, j = self.srv.request("PUT", "/sandboxes", {}, self.h)
        is_e2b_error(self, st, hd, j, 405)
        st, _, j = self.create({"templateID": "base"})
        sid = j["sandboxID"]
        st, hd, j = self.srv.request("DELETE", "/sandboxes/" + sid, headers=self.h)
        self.assertEqual((st, j), (204, None))
        for m, p, b in (("DELETE", "", None), ("GET", "", None), ("POST", "/timeout", {"timeout": 5}),
                        ("POST", "/connect", {"timeout": 5}), ("POST", "/pause", None), ("GET", "/metrics", None)):
            st, hd, j = self.srv.request(m, "/sandboxes/" + sid + p, b, self.h)
            is_e2b_error(self, st, hd, j, 404)

    def test_timeout_connect_pause_metrics(self):
        st, _, j = self.create({"templateID": "base", "timeout": 100})
        sid = j["sandboxID"]
        st, _, j = self.srv.request("POST", "/sandboxes/%s/timeout" % sid, {"timeout": 20}, self.h, chunked=True)
        self.assertEqual((st, j), (204, None))
        st, hd, j = self.srv.request("POST", "/sandboxes/%s/timeout" % sid, {"nope": 1}, self.h)
        is_e2b_error(self, st, hd, j, 400)

        def left():
            _, _, d = self.srv.request("GET", "/sandboxes/" + sid, headers=self.h)
            return time.mktime(time.strptime(d["endAt"][:19], "%Y-%m-%dT%H:%M:%S")) - time.mktime(time.gmtime())
        self.assertTrue(left() <= 21, left())
        # connect extends (never shortens) and hands out a fresh token.
        for path in ("/sandboxes/%s/connect", "/v2/sandboxes/%s/connect"):
            st, _, j = self.srv.request("POST", path % sid, {"timeout": 200}, self.h)
            self.assertEqual(st, 200, j)
            self.assertEqual(j["sandboxID"], sid)
            self.assertTrue(j["envdAccessToken"].startswith("osr1."))
        self.assertTrue(190 <= left() <= 201, left())
        st, _, j = self.srv.request("POST", "/v2/sandboxes/%s/connect" % sid, {"timeout": 5}, self.h)
        self.assertEqual(st, 200, j)
        self.assertTrue(left() > 150, left())
        st, _, j = self.srv.request("POST", "/v2/sandboxes/%s/connect" % sid, None, self.h)
        self.assertEqual(st, 200, j)
        # The sim provider cannot pause: 501 in E2B shape.
        st, hd, j = self.srv.request("POST", "/sandboxes/%s/pause" % sid, None, self.h)
        is_e2b_error(self, st, hd, j, 501)
        st, _, j = self.srv.request("GET", "/sandboxes/%s/metrics?start=1&end=2" % sid, headers=self.h)
        self.assertEqual((st, j), (200, []))

    def test_list(self):
        tag = "lst-%d" % time.time_ns()
        ids = []
        for i in range(5):
            st, _, j = self.create({"templateID": "base", "metadata": {"probe": tag, "a b": "c&d=e"}})
            ids.append(j["sandboxID"])
        self.srv.request("DELETE", "/sandboxes/" + ids[4], headers=self.h)
        # The SDK's encoding: each key/value encoded, joined, then encoded again.
        inner = urllib.parse.urlencode({"probe": tag, urllib.parse.quote("a b"): urllib.parse.quote("c&d=e")})
        seen, token = [], None
        for _ in range(10):
            q = {"metadata": inner, "limit": "2"}
            if token:
                q["nextToken"] = token
            st, hd, j = self.srv.request("GET", "/v2/sandboxes?" + urllib.parse.urlencode(q), headers=self.h)
            self.assertEqual(st, 200, j)
            self.assertLessEqual(len(j), 2)
            seen += [x["sandboxID"] for x in j]
            token = hd.get("x-next-token")
            if not token:
                break
        self.assertEqual(sorted(seen), sorted(ids[:4]))
        q = urllib.parse.urlencode({"metadata": inner})
        st, _, j = self.srv.request("GET", "/sandboxes?" + q, headers=self.h)  # the 1.x path
        self.assertEqual(sorted(x["sandboxID"] for x in j), sorted(ids[:4]))
        for state in ("state=running", "state=running,paused", "state=paused&state=running"):
            st, _, j = self.srv.request("GET", "/v2/sandboxes?%s&%s" % (q, state), headers=self.h)
            self.assertEqual(len(j), 4, (state, j))
        st, _, j = self.srv.request("GET", "/v2/sandboxes?%s&state=paused" % q, headers=self.h)
        self.assertEqual(j, [])
        for bad in ("state=ended", "limit=0", "limit=x", "metadata=novalue"):
            st, hd, j = self.srv.request("GET", "/v2/sandboxes?" + bad, headers=self.h)
            is_e2b_error(self, st, hd, j, 400)


class Domain(unittest.TestCase):
    """The `domain` of create answers: e2b.domain from the YAML file, the
    environment (OSR_E2B_DOMAIN) or the flag (--e2b-domain), flag > env >
    file, else derived from dataplane.url; E2B's own domains refused at
    start from every source, naming it."""

    def domain_of(self, env, cfg=None, args=None):
        with Serve(env=env, cfg=cfg, args=args) as srv:
            st, _, j = srv.request("POST", "/v2/sandboxes", {"templateID": "base"},
                                   {"X-API-KEY": srv.new_key("d")})
            self.assertEqual(st, 201, j)
            return j["domain"]

    def print_config(self, env, cfg=None, args=None):
        """(exit status, effective e2b.domain or None, stderr) of
        `osr serve --print-config`, which loads the configuration as a start
        does and exits."""
        d = tempfile.mkdtemp(prefix="osr-e2b-cfg-")
        try:
            argv = [CLI, "serve", "--print-config", "--data-dir", d] + (args or [])
            if cfg is not None:
                path = os.path.join(d, "osr.yaml")
                with open(path, "w") as f:
                    f.write(cfg)
                argv += ["--config", path]
            e = {"OSR_PROVIDERS": "sim", "OSR_ADMIN_KEY": ADMIN, "OSR_E2B_DOMAIN": ""}
            e.update(env)
            cp = osrtest.sh(argv, env=e, timeout=60, check=False)
            err = cp.stderr.decode("utf-8", "replace")
            if cp.returncode != 0:
                return cp.returncode, None, err
            return 0, json.loads(cp.stdout)["e2b"]["domain"], err
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_answers(self):
        self.assertEqual(self.domain_of({}), None)  # data plane on 127.0.0.1: no wildcard possible
        self.assertEqual(self.domain_of({}, {"dataplane": {"url": "https://dp.example.org:7443/x"}}),
                         "dp.example.org:7443")
        self.assertEqual(self.domain_of({}, {"e2b": {"domain": "file.example.com"},
                                             "dataplane": {"url": "https://dp.example.org/"}}),
                         "file.example.com")
        self.assertEqual(self.domain_of({"OSR_E2B_DOMAIN": "osr.example.com"}), "osr.example.com")
        self.assertEqual(self.domain_of({"OSR_E2B_DOMAIN": "env.example.com"},
                                        {"e2b": {"domain": "file.example.com"}},
                                        ["--e2b-domain", "flag.example.com:8443"]),
                         "flag.example.com:8443")

    def test_precedence(self):
        yaml = "e2b:\n  domain: file.example.com\n"
        self.assertEqual(self.print_config({}, yaml)[:2], (0, "file.example.com"))
        self.assertEqual(self.print_config({"OSR_E2B_DOMAIN": "env.example.com"}, yaml)[:2],
                         (0, "env.example.com"))
        self.assertEqual(self.print_config({"OSR_E2B_DOMAIN": "env.example.com"}, yaml,
                                           ["--e2b-domain=flag.example.com"])[:2],
                         (0, "flag.example.com"))
        self.assertEqual(self.print_config({}, "e2b:\n  domain: null\n")[:2], (0, None))
        self.assertEqual(self.print_config({})[:2], (0, None))

    def test_refused(self):
        for own in ("e2b.app", "E2B.dev", "foo.e2b.pro", "e2b-staging.dev:443"):
            st, _, err = self.print_config({"OSR_E2B_DOMAIN": own})
            self.assertNotEqual(st, 0, own)
            self.assertIn("OSR_E2B_DOMAIN: '%s' is one of E2B's own domains" % own, err)
            st, _, err = self.print_config({}, args=["--e2b-domain", own])
            self.assertNotEqual(st, 0, own)
            self.assertIn("--e2b-domain: '%s' is one of E2B's own domains" % own, err)
            st, _, err = self.print_config({}, "\ne2b:\n  domain: '%s'\n" % own)
            self.assertNotEqual(st, 0, own)
            self.assertRegex(err, r"osr\.yaml:3: e2b\.domain: '%s' is one of E2B's own domains"
                             % re.escape(own))
        # Not E2B's: a look-alike and a subdomain-looking host are fine.
        self.assertEqual(self.print_config({"OSR_E2B_DOMAIN": "e2b.app.example.com"})[:2],
                         (0, "e2b.app.example.com"))
        self.assertEqual(self.print_config({"OSR_E2B_DOMAIN": "mye2b.app"})[:2], (0, "mye2b.app"))
        for bad, why in (("sbx.example.com:", "empty port"), ("sbx.example.com:x", "not a number"),
                         ("sbx_example.com", "not a host name"), (".example.com", "not a host name")):
            st, _, err = self.print_config({}, args=["--e2b-domain", bad])
            self.assertNotEqual(st, 0, bad)
            self.assertIn(why, err)
        st, _, err = self.print_config({}, "e2b:\n  domain: 7\n")
        self.assertNotEqual(st, 0)
        self.assertIn("e2b.domain", err)
        st, _, err = self.print_config({}, "e2b:\n  domian: x.example.com\n")
        self.assertNotEqual(st, 0)
        self.assertIn("domian", err)


if __name__ == "__main__":
    osrtest.run()
