"""The API plumbing of osr-gateway, end to end against the real binary, a real
SQLite store in a temporary data directory and the sim provider:
authentication, API keys, audit, /metrics, /openapi.json against the router
table, typed errors, chunked and HTTP/2 bodies, the admin key file, drain.
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import time
import unittest

import osrtest
import services

GATEWAY = os.environ.get("OSR_GATEWAY", "")
SRC = osrtest.SOURCE_ROOT


class Gateway:
    """osr-gateway on 127.0.0.1:<free port> with its own data directory."""

    def __init__(self, *args, data_dir=None, env=None):
        self.own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="osr-admin-")
        # sim: the embedded default would be the local provider (real sandboxes).
        e = {"OSR_DATA_DIR": self.data_dir, "OSR_LOG_LEVEL": "info", "OSR_PROVIDERS": "sim"}
        for k in ("OSR_ADMIN_KEY", "OSR_STORE", "OSR_REDIS", "OSR_PROVIDERS", "OSR_LISTEN", "OSR_CONFIG"):
            os.environ.pop(k, None)
        if env:
            e.update(env)
        self.proc = osrtest.Proc([GATEWAY, "--listen", "127.0.0.1:0"] + list(args), env=e)
        self.port = self._port()
        path = os.path.join(self.data_dir, "admin.key")
        self.admin = (env or {}).get("OSR_ADMIN_KEY") or open(path).read().strip()

    def _port(self):
        end = time.time() + 30
        while time.time() < end:
            m = re.search(r"listening on \S+ \(port (\d+)", self.proc.stderr_text())
            if m:
                return int(m.group(1))
            if not self.proc.alive():
                raise AssertionError("gateway exited (%s):\n%s" % (self.proc.p.returncode, self.proc.stderr_text()))
            time.sleep(0.05)
        raise AssertionError("gateway did not report its port:\n" + self.proc.stderr_text())

    def request(self, method, path, body=None, key=None, headers=None, raw=None, chunked=False):
        """Returns (status, headers dict (lower-case), parsed JSON or text)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        h = dict(headers or {})
        if key is not None:
            h["Authorization"] = "Bearer " + key
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        if chunked:
            payload = data
            data = iter([payload[:5], payload[5:]])
        c.request(method, path, body=data, headers=h, encode_chunked=chunked)
        r = c.getresponse()
        text = r.read().decode()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        if hdrs.get("content-type", "").startswith("application/json") and text:
            return r.status, hdrs, json.loads(text)
        return r.status, hdrs, text

    def new_key(self, tenant, role=None, name=None):
        body = {"tenant": tenant}
        if role:
            body["role"] = role
        if name:
            body["name"] = name
        st, _, j = self.request("POST", "/v1/keys", body, key=self.admin)
        assert st == 201, (st, j)
        return j

    def stop(self, sig=signal.SIGTERM):
        rc = self.proc.stop(sig, timeout=30)
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.stop()
        if self.own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        # Sanitizer reports (leaks at exit included) make the exit non-zero.
        if exc[0] is None and rc != 0:
            raise AssertionError("gateway exited with %s:\n%s" % (rc, self.proc.stderr_text()[-6000:]))


def error_code(j):
    return j["error"]["code"]


class Auth(unittest.TestCase):
    def test_no_bad_revoked_tenant_admin(self):
        with Gateway() as gw:
            # No key at all.
            st, h, j = gw.request("GET", "/v1/keys")
            self.assertEqual(st, 401)
            self.assertEqual(error_code(j), "unauthorized")
            self.assertTrue(h["www-authenticate"].startswith("Bearer"))
            # Not Bearer.
            st, _, j = gw.request("GET", "/v1/keys", headers={"Authorization": "Basic Zm9vOmJhcg=="})
            self.assertEqual(st, 401)
            # Malformed and well-formed-but-unknown keys.
            for bad in ("nope", "osr_" + "0" * 40, "osr_" + "g" * 40, "x" * 600):
                st, h, j = gw.request("GET", "/v1/keys", key=bad)
                self.assertEqual(st, 401, bad)
                self.assertEqual(error_code(j), "unauthorized")
                self.assertIn("invalid_token", h["www-authenticate"])
            # Admin key: everything.
            st, _, j = gw.request("GET", "/v1/keys", key=gw.admin)
            self.assertEqual(st, 200, j)
            # A tenant key works on tenant routes, is refused on admin routes.
            k = gw.new_key("acme")
            self.assertRegex(k["key"], r"^osr_[0-9a-f]{40}$")
            st, _, j = gw.request("GET", "/v1/keys", key=k["key"])
            self.assertEqual(st, 200, j)
            for method, path, body in (("POST", "/v1/keys", {"tenant": "acme"}),
                                       ("DELETE", "/v1/keys/" + k["keyId"], None),
                                       ("GET", "/metrics", None)):
                st, _, j = gw.request(method, path, body, key=k["key"])
                self.assertEqual(st, 403, (method, path, j))
                self.assertEqual(error_code(j), "forbidden")
            # Revoked: refused at once (the positive cache is invalidated).
            st, _, _ = gw.request("DELETE", "/v1/keys/" + k["keyId"], key=gw.admin)
            self.assertEqual(st, 204)
            st, _, j = gw.request("GET", "/v1/keys", key=k["key"])
            self.assertEqual(st, 401, j)
            # An admin-role key created through the API is an admin.
            a = gw.new_key("ops", role="admin")
            st, _, j = gw.request("GET", "/metrics", key=a["key"])
            self.assertEqual(st, 200)

    def test_unauthenticated_endpoints(self):
        with Gateway() as gw:
            for path in ("/healthz", "/readyz", "/version", "/openapi.json"):
                st, _, j = gw.request("GET", path)
                self.assertEqual(st, 200, (path, j))
            st, _, j = gw.request("GET", "/readyz")
            self.assertEqual(j["store"], "ok")


class Keys(unittest.TestCase):
    def test_lifecycle_and_scoping(self):
        with Gateway() as gw:
            a1 = gw.new_key("tenant-a", name="ci")
            a2 = gw.new_key("tenant-a")
            b1 = gw.new_key("tenant-b")
            self.assertEqual((a1["tenant"], a1["role"], a1["name"]), ("tenant-a", "tenant", "ci"))
            self.assertRegex(a1["keyId"], r"^k[0-9a-f]{20}$")
            self.assertRegex(a1["createdAt"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
            # Admin: all keys, or one tenant's. Secrets never listed.
            st, _, j = gw.request("GET", "/v1/keys", key=gw.admin)
            ids = {k["keyId"] for k in j["items"]}
            self.assertTrue({a1["keyId"], a2["keyId"], b1["keyId"]} <= ids)
            self.assertNotIn(a1["key"], json.dumps(j))
            st, _, j = gw.request("GET", "/v1/keys?tenant=tenant-b", key=gw.admin)
            self.assertEqual([k["keyId"] for k in j["items"]], [b1["keyId"]])
            # Query values are percent-decoded; broken escapes are refused.
            st, _, j = gw.request("GET", "/v1/keys?x=1&tenant=tenant%2Db&y", key=gw.admin)
            self.assertEqual([k["keyId"] for k in j["items"]], [b1["keyId"]])
            for bad in ("tenant=%zz", "tenant=%2", "tenant=a%00", "tenant=a%20b", "tenant=" + "x" * 100):
                st, _, j = gw.request("GET", "/v1/keys?" + bad, key=gw.admin)
                self.assertEqual((st, error_code(j)), (400, "invalid_request"), bad)
            # Tenant: its own keys only; naming another tenant is forbidden.
            st, _, j = gw.request("GET", "/v1/keys", key=a1["key"])
            self.assertEqual(st, 200)
            self.assertEqual({k["keyId"] for k in j["items"]}, {a1["keyId"], a2["keyId"]})
            self.assertNotIn("key", j["items"][0])
            st, _, j = gw.request("GET", "/v1/keys?tenant=tenant-b", key=a1["key"])
            self.assertEqual(st, 403)
            # Revoke: 204, then 404 for an unknown id; the other key still works.
            st, _, _ = gw.request("DELETE", "/v1/keys/" + a2["keyId"], key=gw.admin)
            self.assertEqual(st, 204)
            st, _, j = gw.request("GET", "/v1/keys", key=a2["key"])
            self.assertEqual(st, 401)
            st, _, j = gw.request("GET", "/v1/keys", key=a1["key"])
            self.assertEqual(st, 200)
            st, _, j = gw.request("DELETE", "/v1/keys/k00000000000000000000", key=gw.admin)
            self.assertEqual(st, 404)
            self.assertEqual(error_code(j), "not_found")

    def test_create_validation(self):
        with Gateway() as gw:
            for body, field in (({}, "tenant"), ({"tenant": ""}, "tenant"), ({"tenant": "a b"}, "tenant"),
                                ({"tenant": 5}, "tenant"), ({"tenant": "x" * 64}, "tenant"),
                                ({"tenant": "t", "role": "root"}, "role"),
                                ({"tenant": "t", "name": 1}, "name"),
                                ({"tenant": "t", "bogus": 1}, "bogus")):
                st, _, j = gw.request("POST", "/v1/keys", body, key=gw.admin)
                self.assertEqual(st, 400, body)
                self.assertEqual(error_code(j), "invalid_request")
                self.assertEqual(j["error"]["field"], field, body)
            st, _, j = gw.request("POST", "/v1/keys", key=gw.admin)
            self.assertEqual(st, 400)

    def test_keys_survive_restart(self):
        d = tempfile.mkdtemp(prefix="osr-admin-")
        try:
            with Gateway(data_dir=d) as gw:
                k = gw.new_key("persist")
            with Gateway(data_dir=d) as gw:
                st, _, j = gw.request("GET", "/v1/keys", key=k["key"])
                self.assertEqual(st, 200, j)
                self.assertEqual(j["items"][0]["tenant"], "persist")
        finally:
            shutil.rmtree(d, ignore_errors=True)


class Audit(unittest.TestCase):
    def test_events_scoped_newest_first_paginated(self):
        with Gateway() as gw:
            keys = [gw.new_key("aud-%d" % i) for i in range(3)]
            st, _, _ = gw.request("DELETE", "/v1/keys/" + keys[0]["keyId"], key=gw.admin)
            self.assertEqual(st, 204)
            t = gw.new_key("aud-tenant")
            # Sandbox mutations are audited in the caller's tenant.
            st, _, sbx = gw.request("POST", "/v1/sandboxes", {"template": "base"}, key=t["key"])
            self.assertEqual(st, 201, sbx)
            created = True
            st, _, _ = gw.request("DELETE", "/v1/sandboxes/" + sbx["id"], key=t["key"])
            self.assertIn(st, (200, 204))
            # Events are written fire-and-forget: wait until they are in.
            end = time.time() + 10
            while time.time() < end:
                st, _, j = gw.request("GET", "/v1/audit?limit=1000", key=gw.admin)
                self.assertEqual(st, 200, j)
                if len([e for e in j["items"] if e["action"].startswith("key.")]) >= 5:
                    break
                time.sleep(0.1)
            items = j["items"]
            seqs = [e["seq"] for e in items]
            self.assertEqual(seqs, sorted(seqs, reverse=True))
            for e in items:
                for f in ("seq", "at", "actor", "action", "sandboxId", "outcome", "detail"):
                    self.assertIn(f, e)
            kc = [e for e in items if e["action"] == "key.create"]
            self.assertEqual(len(kc), 4)
            self.assertTrue(all(e["actor"] == "admin" and e["outcome"] == "ok" for e in kc))
            self.assertEqual({e["detail"]["tenant"] for e in kc}, {"aud-0", "aud-1", "aud-2", "aud-tenant"})
            kr = [e for e in items if e["action"] == "key.revoke"]
            self.assertEqual(len(kr), 1)
            self.assertEqual(kr[0]["detail"]["keyId"], keys[0]["keyId"])
            # Pagination: limit=2 pages through the same events.
            seen, cursor = [], None
            for _ in range(50):
                q = "/v1/audit?limit=2" + ("&cursor=" + cursor if cursor else "")
                st, _, p = gw.request("GET", q, key=gw.admin)
                self.assertEqual(st, 200, p)
                self.assertLessEqual(len(p["items"]), 2)
                seen += [e["seq"] for e in p["items"]]
                cursor = p["nextCursor"]
                if not cursor:
                    break
            self.assertEqual(seen[:len(seqs)], seqs)
            # The tenant sees only its own tenant's events.
            st, _, j = gw.request("GET", "/v1/audit", key=t["key"])
            self.assertEqual(st, 200)
            self.assertTrue(all(e.get("tenant", "aud-tenant") == "aud-tenant" for e in j["items"]))
            self.assertFalse([e for e in j["items"] if e["action"].startswith("key.")])
            if created:
                end = time.time() + 10
                while time.time() < end and len(j["items"]) < 2:
                    time.sleep(0.1)
                    st, _, j = gw.request("GET", "/v1/audit", key=t["key"])
                acts = [(e["action"], e["sandboxId"], e["actor"]) for e in j["items"]]
                self.assertIn(("create", sbx["id"], t["keyId"]), acts)
                self.assertIn(("kill", sbx["id"], t["keyId"]), acts)
            st, _, j = gw.request("GET", "/v1/audit?tenant=other", key=t["key"])
            self.assertEqual(st, 403)
            for bad in ("limit=0", "limit=1001", "limit=x", "limit="):
                st, _, j = gw.request("GET", "/v1/audit?" + bad, key=gw.admin)
                self.assertEqual(st, 400, bad)


# ---- Prometheus text format 0.0.4 parser (the subset we emit) ----------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"(,|$)')


def parse_metrics(text):
    """Returns {family: {"type":, "help":, "samples": [(name, labels, value)]}};
    raises on any line that is not valid."""
    fams = {}
    cur = None
    assert text.endswith("\n"), "exposition must end with a newline"
    for ln in text.split("\n")[:-1]:
        if ln.startswith("# HELP "):
            name, _, help_ = ln[7:].partition(" ")
            fams.setdefault(name, {"samples": []})["help"] = help_
            continue
        if ln.startswith("# TYPE "):
            name, _, typ = ln[7:].partition(" ")
            assert typ in ("counter", "gauge", "histogram", "summary", "untyped"), ln
            assert "type" not in fams.get(name, {}), "duplicate TYPE " + name
            fams.setdefault(name, {"samples": []})["type"] = typ
            cur = name
            continue
        assert not ln.startswith("#") and ln, "bad line %r" % ln
        m = SAMPLE.match(ln)
        assert m, "bad sample %r" % ln
        name, labels_s, value = m.group(1), m.group(3) or "", m.group(4)
        labels = {}
        pos = 0
        while pos < len(labels_s):
            lm = LABEL.match(labels_s, pos)
            assert lm, "bad labels in %r" % ln
            labels[lm.group(1)] = lm.group(2)
            pos = lm.end()
        v = float(value)  # raises on garbage; +Inf/NaN parse too
        base = name
        for suf in ("_bucket", "_sum", "_count"):
            if name.endswith(suf) and fams.get(name[:-len(suf)], {}).get("type") == "histogram":
                base = name[:-len(suf)]
        assert base == cur, "sample %s outside its family %s" % (name, cur)
        fams[base]["samples"].append((name, labels, v))
    return fams


def check_histograms(fams):
    for name, f in fams.items():
        if f.get("type") != "histogram":
            continue
        groups = {}
        for n, labels, v in f["samples"]:
            key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
            groups.setdefault(key, {"buckets": [], "sum": None, "count": None})
            if n.endswith("_bucket"):
                groups[key]["buckets"].append((float(labels["le"]), v))
            elif n.endswith("_sum"):
                groups[key]["sum"] = v
            else:
                groups[key]["count"] = v
        for key, g in groups.items():
            les = [le for le, _ in g["buckets"]]
            assert les == sorted(les) and les[-1] == float("inf"), (name, key, les)
            counts = [c for _, c in g["buckets"]]
            assert counts == sorted(counts), "buckets not monotonic: %s %s %s" % (name, key, counts)
            assert g["count"] == counts[-1], (name, key)
            assert g["sum"] is not None and g["sum"] >= 0


def value(fams, family, sample=None, **labels):
    total = 0.0
    for n, l, v in fams.get(family, {"samples": []})["samples"]:
        if (sample or family) == n and all(l.get(k) == x for k, x in labels.items()):
            total += v
    return total


class Metrics(unittest.TestCase):
    def test_format_counters_histograms(self):
        with Gateway() as gw:
            for _ in range(3):
                gw.request("GET", "/healthz")
            gw.request("GET", "/nope")
            gw.request("GET", "/v1/keys")  # 401
            st, h, text = gw.request("GET", "/metrics", key=gw.admin)
            self.assertEqual(st, 200)
            self.assertTrue(h["content-type"].startswith("text/plain; version=0.0.4"))
            f1 = parse_metrics(text)
            check_histograms(f1)
            expected = {"osr_http_requests_total": "counter", "osr_http_request_duration_seconds": "histogram",
                        "osr_creates_total": "counter", "osr_create_failovers_total": "counter",
                        "osr_create_duration_seconds": "histogram", "osr_provider_breaker_state": "gauge",
                        "osr_provider_create_latency_ewma_ms": "gauge", "osr_sandboxes": "gauge",
                        "osr_store_latency_seconds": "gauge", "osr_redis_latency_seconds": "gauge",
                        "osr_redis_up": "gauge", "osr_reaper_actions_total": "counter",
                        "osr_audit_failures_total": "counter"}
            for name, typ in expected.items():
                self.assertEqual(f1.get(name, {}).get("type"), typ, name)
                self.assertTrue(f1[name].get("help"), name)
            self.assertGreaterEqual(value(f1, "osr_http_requests_total", route="/healthz", method="GET", code="200"), 3)
            self.assertEqual(value(f1, "osr_http_requests_total", route="unmatched", code="404"), 1)
            self.assertEqual(value(f1, "osr_http_requests_total", route="/v1/keys", code="401"), 1)
            self.assertEqual(value(f1, "osr_provider_breaker_state", provider="sim"), 0)
            self.assertEqual(value(f1, "osr_redis_up"), 0)
            # A create through the sim provider shows up per provider and outcome.
            k = gw.new_key("metrics")
            st, _, sbx = gw.request("POST", "/v1/sandboxes", {}, key=k["key"])
            self.assertEqual(st, 201, sbx)
            # Routes are patterns: ids never become label values.
            gw.request("GET", "/v1/sandboxes/abc123", key=gw.admin)
            gw.request("DELETE", "/v1/keys/k0123", key=gw.admin)
            for _ in range(2):
                gw.request("GET", "/healthz")
            st, _, text = gw.request("GET", "/metrics", key=gw.admin)
            f2 = parse_metrics(text)
            check_histograms(f2)
            self.assertEqual(value(f2, "osr_creates_total", provider="sim", outcome="ok"), 1)
            self.assertEqual(value(f2, "osr_create_duration_seconds", "osr_create_duration_seconds_count"), 1)
            self.assertEqual(value(f2, "osr_http_requests_total", route="/v1/sandboxes", method="POST", code="201"), 1)
            routes = {l["route"] for n, l, v in f2["osr_http_requests_total"]["samples"]}
            self.assertNotIn("/v1/sandboxes/abc123", routes)
            self.assertIn("/v1/sandboxes/{id}", routes)
            self.assertIn("/v1/keys/{id}", routes)
            # Counters only go up.
            for n, l, v in f1["osr_http_requests_total"]["samples"]:
                self.assertGreaterEqual(value(f2, "osr_http_requests_total", **l), v)
            self.assertEqual(value(f2, "osr_http_requests_total", route="/healthz", method="GET", code="200"),
                             value(f1, "osr_http_requests_total", route="/healthz", method="GET", code="200") + 2)
            self.assertGreater(value(f2, "osr_http_request_duration_seconds", "osr_http_request_duration_seconds_count",
                                     route="/healthz"),
                               value(f1, "osr_http_request_duration_seconds", "osr_http_request_duration_seconds_count",
                                     route="/healthz"))

    def test_parser_rejects_garbage(self):
        # The parser must be able to fail, or the test above proves nothing.
        for bad in ("# TYPE x counter\nx{a=\"b} 1\n", "# TYPE x counter\nx 1 2 3\n", "x 1",
                    "# TYPE x counter\ny 1\n", "# TYPE x counter\nx one\n"):
            with self.assertRaises((AssertionError, ValueError)):
                parse_metrics(bad)
        with self.assertRaises(AssertionError):
            check_histograms(parse_metrics(
                '# TYPE h histogram\nh_bucket{le="1"} 5\nh_bucket{le="+Inf"} 3\nh_sum 1\nh_count 3\n'))


def router_table():
    """(method, pattern) pairs from the ROUTE(...) lines of src/gateway/api.c."""
    with open(os.path.join(SRC, "src", "gateway", "api.c")) as f:
        src = f.read()
    rows = re.findall(r'^\s*ROUTE\("([A-Z]+)", "([^"]+)"', src, re.M)
    assert len(rows) >= 10, "route table not found in api.c"
    return set(rows)


class OpenAPI(unittest.TestCase):
    def test_document_matches_router(self):
        with Gateway() as gw:
            st, h, doc = gw.request("GET", "/openapi.json")
            self.assertEqual(st, 200)
            self.assertTrue(doc["openapi"].startswith("3.0"))
            self.assertEqual(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer")
            codes = set(doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"])
            for c in ("invalid_request", "unauthorized", "forbidden", "not_found", "method_not_allowed",
                      "idempotency_conflict", "payload_too_large", "no_capable_provider",
                      "all_providers_failed", "unavailable", "internal"):
                self.assertIn(c, codes)
            documented = set()
            for path, ops in doc["paths"].items():
                for m in ops:
                    if m != "parameters":
                        documented.add((m.upper(), path))
            table = router_table()
            self.assertEqual(table, documented, "router table and openapi.json differ")
            # Every $ref resolves.
            refs = re.findall(r'"\$ref": "#/components/(\w+)/(\w+)"', json.dumps(doc))
            for kind, name in refs:
                self.assertIn(name, doc["components"][kind])
            # The running router knows every route: with the admin key no
            # documented operation answers 404-no-such-endpoint or 405.
            for method, path in sorted(table):
                p = path.replace("{id}", "k0000")
                body = {} if method == "POST" else None
                st, _, j = gw.request(method, p, body, key=gw.admin)
                self.assertNotEqual(st, 405, (method, p))
                if st == 404:
                    self.assertNotEqual(j["error"]["message"], "no such endpoint", (method, p))


class Errors(unittest.TestCase):
    def test_typed_errors(self):
        with Gateway() as gw:
            st, _, j = gw.request("GET", "/v1/nothing-here", key=gw.admin)
            self.assertEqual((st, error_code(j)), (404, "not_found"))
            st, _, j = gw.request("GET", "/v1/sandboxes/UPPER", key=gw.admin)
            self.assertEqual((st, error_code(j)), (404, "not_found"))
            st, h, j = gw.request("PUT", "/v1/keys", key=gw.admin)
            self.assertEqual((st, error_code(j)), (405, "method_not_allowed"))
            self.assertEqual(sorted(h["allow"].split(", ")), ["GET", "POST"])
            st, h, j = gw.request("POST", "/healthz")
            self.assertEqual(st, 405)
            self.assertEqual(h["allow"], "GET")
            # Malformed JSON: jansson's text and position.
            st, _, j = gw.request("POST", "/v1/keys", raw=b'{"tenant": "a",', key=gw.admin,
                                  headers={"Content-Type": "application/json"})
            self.assertEqual((st, error_code(j)), (400, "invalid_request"))
            self.assertIn("malformed JSON", j["error"]["message"])
            self.assertIn("position", j["error"])
            self.assertIn("line", j["error"])
            # Not an object; duplicate keys.
            for raw in (b'[1,2]', b'"x"', b'{"tenant":"a","tenant":"b"}'):
                st, _, j = gw.request("POST", "/v1/keys", raw=raw, key=gw.admin,
                                      headers={"Content-Type": "application/json"})
                self.assertEqual((st, error_code(j)), (400, "invalid_request"), raw)
            # Wrong content type.
            st, _, j = gw.request("POST", "/v1/keys", raw=b'{"tenant":"a"}', key=gw.admin,
                                  headers={"Content-Type": "text/plain"})
            self.assertEqual((st, error_code(j)), (415, "invalid_request"))
            st, _, j = gw.request("POST", "/v1/keys", raw=b'{"tenant":"a"}', key=gw.admin,
                                  headers={"Content-Type": "application/json; charset=utf-8"})
            self.assertEqual(st, 201, j)
            # Over the 1 MiB default cap: announced, and chunked (no length).
            big = b'{"tenant":"' + b"a" * (1 << 20) + b'"}'
            st, _, j = gw.request("POST", "/v1/keys", raw=big, key=gw.admin,
                                  headers={"Content-Type": "application/json"})
            self.assertEqual((st, error_code(j)), (413, "payload_too_large"))
            c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=15)
            c.request("POST", "/v1/keys", body=iter([big[:1000], big[1000:]]), encode_chunked=True,
                      headers={"Content-Type": "application/json", "Authorization": "Bearer " + gw.admin})
            r = c.getresponse()
            self.assertEqual(r.status, 413)
            self.assertEqual(json.loads(r.read())["error"]["code"], "payload_too_large")
            c.close()
            # Still healthy after all that.
            st, _, _ = gw.request("GET", "/healthz")
            self.assertEqual(st, 200)

    def test_chunked_body_accepted(self):
        with Gateway() as gw:
            st, _, j = gw.request("POST", "/v1/keys", {"tenant": "chunky"}, key=gw.admin, chunked=True)
            self.assertEqual(st, 201, j)
            self.assertEqual(j["tenant"], "chunky")

    @unittest.skipUnless(osrtest.have("curl"), "curl not installed")
    def test_http2_prior_knowledge(self):
        with Gateway() as gw:
            cp = osrtest.sh(["curl", "-sS", "--max-time", "10", "--http2-prior-knowledge", "-w", "\n%{http_code} %{http_version}",
                             "-H", "Authorization: Bearer " + gw.admin, "-H", "Content-Type: application/json",
                             "--data-binary", '{"tenant":"h2"}', "http://127.0.0.1:%d/v1/keys" % gw.port])
            body, _, tail = cp.stdout.decode().rpartition("\n")
            self.assertEqual(tail.split(), ["201", "2"])
            self.assertEqual(json.loads(body)["tenant"], "h2")
            cp = osrtest.sh(["curl", "-sS", "--max-time", "10", "--http2-prior-knowledge", "-w", "\n%{http_code} %{http_version}",
                             "http://127.0.0.1:%d/v1/keys" % gw.port])
            body, _, tail = cp.stdout.decode().rpartition("\n")
            self.assertEqual(tail.split(), ["401", "2"])
            self.assertEqual(json.loads(body)["error"]["code"], "unauthorized")


class AdminKeyFile(unittest.TestCase):
    def test_generated_0600_and_reused(self):
        d = tempfile.mkdtemp(prefix="osr-admin-")
        data = os.path.join(d, "nested", "data")
        try:
            with Gateway(data_dir=data) as gw:
                path = os.path.join(data, "admin.key")
                mode = stat.S_IMODE(os.stat(path).st_mode)
                self.assertEqual(mode, 0o600)
                self.assertEqual(stat.S_IMODE(os.stat(data).st_mode), 0o700)
                first = open(path).read().strip()
                self.assertRegex(first, r"^osr_[0-9a-f]{40}$")
                self.assertIn(path, gw.proc.stderr_text())
                # The key itself is never logged.
                self.assertNotIn(first, gw.proc.stderr_text())
                st, _, _ = gw.request("GET", "/v1/keys", key=first)
                self.assertEqual(st, 200)
            with Gateway(data_dir=data) as gw:
                self.assertEqual(open(path).read().strip(), first)
                st, _, _ = gw.request("GET", "/v1/keys", key=first)
                self.assertEqual(st, 200)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_env_admin_key_wins(self):
        key = "my-own-admin-secret-123"
        with Gateway(env={"OSR_ADMIN_KEY": key}) as gw:
            self.assertFalse(os.path.exists(os.path.join(gw.data_dir, "admin.key")))
            st, _, _ = gw.request("GET", "/v1/keys", key=key)
            self.assertEqual(st, 200)
            self.assertNotIn(key, gw.proc.stderr_text())
            st, _, _ = gw.request("GET", "/v1/keys", key=key + "x")
            self.assertEqual(st, 401)


class Lifecycle(unittest.TestCase):
    def test_sigterm_drains_exit_zero(self):
        gw = Gateway("--drain-ms", "60000")
        try:
            s = socket.create_connection(("127.0.0.1", gw.port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertIn(b"200", s.recv(4096))
            t0 = time.time()
            rc = gw.stop(signal.SIGTERM)
            self.assertEqual(rc, 0, gw.proc.stderr_text()[-4000:])
            self.assertLess(time.time() - t0, 30)
            err = gw.proc.stderr_text()
            self.assertIn("drained", err)
            self.assertIn("stopped (exit 0)", err)
            s.close()
        finally:
            gw.stop(signal.SIGKILL)
            shutil.rmtree(gw.data_dir, ignore_errors=True)

    def test_store_failure_exit_1_names_url_without_password(self):
        d = tempfile.mkdtemp(prefix="osr-admin-")
        try:
            # Nothing listens on port 1: the store cannot open.
            cp = osrtest.sh([GATEWAY, "--listen", "127.0.0.1:0", "--data-dir", d,
                             "--store", "postgres://osr:hunter2@127.0.0.1:1/osr"], check=False, timeout=60)
            err = cp.stderr.decode()
            self.assertEqual(cp.returncode, 1, err)
            self.assertIn("postgres://127.0.0.1:1/osr", err)
            self.assertNotIn("hunter2", err)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_readyz_follows_the_store(self):
        with services.PgServer() as pg:
            with Gateway("--store", pg.url) as gw:
                st, _, j = gw.request("GET", "/readyz")
                self.assertEqual((st, j["store"]), (200, "ok"), j)
                pg.stop()
                end = time.time() + 30
                while time.time() < end:
                    st, _, j = gw.request("GET", "/readyz")
                    if st == 503:
                        break
                    time.sleep(0.2)
                self.assertEqual(st, 503, j)
                self.assertEqual(j["status"], "unavailable")
                # Liveness is not readiness.
                st, _, _ = gw.request("GET", "/healthz")
                self.assertEqual(st, 200)
                # Keys cannot be checked without the store: 503, not 401.
                st, _, j = gw.request("GET", "/v1/keys", key="osr_" + "a" * 40)
                self.assertEqual((st, error_code(j)), (503, "unavailable"))
                pg.start()
                end = time.time() + 60
                while time.time() < end:
                    st, _, j = gw.request("GET", "/readyz")
                    if st == 200:
                        break
                    time.sleep(0.2)
                self.assertEqual(st, 200, j)

    def test_redis_up_and_down(self):
        with services.RedisServer() as r:
            with Gateway("--redis", r.url) as gw:
                def redis_up():
                    st, _, text = gw.request("GET", "/metrics", key=gw.admin)
                    return value(parse_metrics(text), "osr_redis_up")
                end = time.time() + 20
                while time.time() < end and redis_up() != 1:
                    time.sleep(0.1)
                self.assertEqual(redis_up(), 1)
                r.stop()
                end = time.time() + 20
                while time.time() < end and redis_up() != 0:
                    time.sleep(0.1)
                self.assertEqual(redis_up(), 0)
                # The API keeps working without Redis.
                k = gw.new_key("no-redis")
                st, _, _ = gw.request("GET", "/v1/keys", key=k["key"])
                self.assertEqual(st, 200)

    def test_client_gone_before_answer(self):
        with Gateway() as gw:
            # Half a body, then hang up: the call ends without an answer and
            # is counted as 499; nothing leaks (ASan checks at exit).
            for _ in range(3):
                s = socket.create_connection(("127.0.0.1", gw.port))
                s.sendall(b"POST /v1/keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + gw.admin.encode() +
                          b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"tenant\":")
                time.sleep(0.05)
                s.close()
            end = time.time() + 10
            n = 0
            while time.time() < end:
                st, _, text = gw.request("GET", "/metrics", key=gw.admin)
                n = value(parse_metrics(text), "osr_http_requests_total", route="/v1/keys", code="499")
                if n == 3:
                    break
                time.sleep(0.1)
            self.assertEqual(n, 3)

    def test_bad_provider_config_exit_2(self):
        d = tempfile.mkdtemp(prefix="osr-admin-")
        try:
            cp = osrtest.sh([GATEWAY, "--listen", "127.0.0.1:0", "--data-dir", d,
                             "--providers", '[{"name":"x","type":"no-such-adapter"}]'], check=False, timeout=30)
            self.assertEqual(cp.returncode, 2, cp.stderr.decode())
            self.assertIn("no-such-adapter", cp.stderr.decode())
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    osrtest.run()
