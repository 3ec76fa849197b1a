"""The e2b provider adapter (adapters/e2b.c) and the data plane's passthrough
to a provider's own envd (src/dataplane/upstream.c), against a FAKE E2B.

The fake is a second `osr serve` (local provider, real osr-agent in a real
bwrap sandbox) whose E2B front door (src/gateway/api_e2b.c, proven field by
field against the real e2b SDK in test_e2b.py) plays E2B's REST API, plus an
`osr-dataplane` on TLS (a throwaway CA) with the fake's keys and domain
playing E2B's envd domain: it accepts only the fake's own envdAccessToken.
The OUTER `osr serve` has providers of type e2b pointed at the fake (api_url,
sandbox_url = the fake's TLS data plane, SSL_CERT_FILE = the test CA).

- Passthrough: the real e2b SDK (e2b_provider.js) creates through the outer
  E2B front door, runs commands and reads/writes files through the outer
  data plane with the outer token; the sandbox lives in the fake.
- The binding says provider e2b; the fake's sandbox carries our labels.
- The fake's envdAccessToken never appears in what the client gets (API
  answers, the token's readable claims), and the outer token is refused by
  the fake (so what reached it was its own token).
- Kill through the outer gateway destroys the sandbox in the fake.
- A wrong API key: create fails with the auth class and no failover.
- Crash recovery's listing: a labelled sandbox in the fake with no binding in
  the outer is found by list() and destroyed as an orphan by the reaper.
"""
import base64
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "lib"))
import osrtest  # noqa: E402

CLI = os.environ.get("OSR_CLI", "")
DATAPLANE = os.path.join(os.environ.get("OSR_BUILD_ROOT", ""), "src", "osr-dataplane")
ADMIN = "osr-admin-e2b-provider-test-0123456789"
FAKE_DOMAIN = "fake-e2b.test"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def request(port, method, path, body=None, headers=None, tls_ca=None, timeout=60):
    """(status, headers lower-cased, parsed JSON or text or None)."""
    if tls_ca is not None:
        ctx = ssl.create_default_context(cafile=tls_ca)
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=ctx)
    else:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
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


class Serve:
    """`osr serve` on loopback ports with a temp data dir; `cfg` is written
    as its YAML (JSON is YAML)."""

    def __init__(self, name, env, cfg=None):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="osr-e2bprov-%s-" % name)
        self.dp_port = free_port()
        argv = [CLI, "serve", "--listen", "127.0.0.1:0", "--dataplane-listen",
                "127.0.0.1:%d" % self.dp_port, "--data-dir", self.dir, "--log-level", "debug"]
        if cfg is not None:
            path = os.path.join(self.dir, "osr.yaml")
            with open(path, "w") as f:
                json.dump(cfg, f)
            argv += ["--config", path]
        e = {"OSR_ADMIN_KEY": ADMIN}
        e.update(env)
        self.argv, self.env, self.old_logs = argv, e, ""
        self._start()

    def kill9(self):
        """kill -9 (also of a SIGSTOPped process); the data dir stays."""
        self.proc.stop(signal.SIGKILL)
        self.old_logs += self.proc.stderr_text() + "\n--- killed -9 ---\n"

    def restart(self):
        """The same command on the same data dir and data-plane port."""
        self._start()

    def _start(self):
        self.proc = osrtest.Proc(self.argv, env=self.env)
        self.port = None
        end = time.time() + 60
        while time.time() < end:
            text = self.proc.stderr_text()
            m = re.search(r"listening on \S+ \(port (\d+)", text)
            if m and "data plane serving" in text:
                self.port = int(m.group(1))
                return
            if not self.proc.alive():
                break
            time.sleep(0.05)
        text = self.proc.stderr_text()
        self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        raise AssertionError("%s: osr serve did not start:\n%s" % (name, text[-4000:]))

    def stop(self):
        rc = self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def log(self):
        return self.old_logs + self.proc.stderr_text()

    def call(self, method, path, body=None, key=ADMIN, headers=None):
        h = {"Authorization": "Bearer " + key}
        h.update(headers or {})
        return request(self.port, method, path, body, h)

    def new_key(self, tenant):
        st, _, j = self.call("POST", "/v1/keys", {"tenant": tenant, "format": "e2b"})
        assert st == 201, (st, j)
        return j["key"]


def clean_env():
    for k in ("OSR_LISTEN", "OSR_STORE", "OSR_REDIS", "OSR_CONFIG", "OSR_DATAPLANE_LISTEN",
              "OSR_E2B_DOMAIN", "OSR_PROVIDERS", "OSR_DATA_DIR"):
        os.environ.pop(k, None)


class Fake:
    """The FAKE E2B: `osr serve` on the local provider (its E2B front door is
    E2B's API) + `osr-dataplane` on TLS for the domain fake-e2b.test (E2B's
    envd/port proxy), verifying with the fake's keys only."""

    def __init__(self, certs):
        self.srv = Serve("fake", {"OSR_PROVIDERS": "local"}, {"e2b": {"domain": FAKE_DOMAIN}})
        try:
            self.key = self.srv.new_key("fake-e2b-account")
            keys = os.path.join(self.srv.dir, "keys")
            self.tls_port = free_port()
            self.dp = osrtest.Proc([DATAPLANE, "--listen", "127.0.0.1:%d" % self.tls_port,
                                    "--tls-cert", certs.cert, "--tls-key", certs.key,
                                    "--keys-dir", keys, "--agent-secret-file",
                                    os.path.join(keys, "agent.secret"), "--domain", FAKE_DOMAIN,
                                    "--log-level", "debug"])
            end = time.time() + 30
            while time.time() < end:
                try:
                    socket.create_connection(("127.0.0.1", self.tls_port), timeout=1).close()
                    break
                except OSError:
                    if not self.dp.alive():
                        raise AssertionError("fake data plane died:\n" + self.dp.stderr_text())
                    time.sleep(0.05)
        except BaseException:
            self.srv.stop()
            raise

    def api(self, method, path, body=None, key=None):
        h = {"X-API-KEY": key or self.key}
        return request(self.srv.port, method, path, body, h)

    def stop(self):
        rc = self.dp.stop()
        return rc, self.srv.stop()


def outer_cfg(fake, providers=None, extra=None):
    base = {"name": "e2b", "type": "e2b", "api_url": "http://127.0.0.1:%d" % fake.srv.port,
            "api_key": {"env": "FAKE_E2B_KEY"},
            "sandbox_url": "https://127.0.0.1:%d" % fake.tls_port, "domain": FAKE_DOMAIN,
            "timeout_ms": 60000}
    cfg = {"providers": providers(base) if providers else [base]}
    cfg.update(extra or {})
    return cfg


def token_claims_text(tok):
    """The readable part of an OSR binding token (signed, not encrypted)."""
    payload = tok.split(".")[1]
    return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))


class Base:
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("the fake's local provider needs root")
        if shutil.which("bwrap") is None:
            self.skipTest("bwrap is not installed")
        clean_env()
        self.certs = osrtest.Certs(names=("localhost", "*." + FAKE_DOMAIN))
        self.fake = Fake(self.certs)
        self.outer = None

    def start_outer(self, cfg):
        self.outer = Serve("outer", {"FAKE_E2B_KEY": self.fake.key,
                                     "SSL_CERT_FILE": self.certs.ca}, cfg)

    def tearDown(self):
        logs = []
        if self.outer is not None:
            logs.append("outer:\n" + self.outer.log()[-3000:])
            rc = self.outer.stop()
            self.assertEqual(rc, 0, logs[-1])
        if getattr(self, "fake", None) is not None:
            logs.append("fake:\n" + self.fake.srv.log()[-3000:])
            rc_dp, rc_srv = self.fake.stop()
            self.assertEqual((rc_dp, rc_srv), (0, 0), "\n".join(logs))
        if getattr(self, "certs", None) is not None:
            self.certs.cleanup()

    def logs(self):
        return ("\nouter:\n" + (self.outer.log()[-5000:] if self.outer else "") +
                "\nfake:\n" + self.fake.srv.log()[-3000:] + "\nfake dp:\n" +
                self.fake.dp.stderr_text()[-3000:])

    def fake_sandbox(self, fake_id):
        return self.fake.api("GET", "/sandboxes/" + fake_id)


class Passthrough(Base, unittest.TestCase):
    def test_sdk_through_outer_to_fake(self):
        if not os.path.isdir(os.path.join(osrtest.node_modules(), "e2b")):
            self.fail("npm e2b is not installed: run npm ci --prefix tests")
        self.start_outer(outer_cfg(self.fake))
        key = self.outer.new_key("outer-tenant")

        # 1. OSR's own API: placed on e2b, the binding names the fake's id.
        st, _, sb = self.outer.call("POST", "/v1/sandboxes", {"template": "base",
                                                              "metadata": {"k": "v"}}, key=key)
        self.assertEqual(st, 201, str(sb) + self.logs())
        self.assertEqual(sb["binding"]["provider"], "e2b")
        self.assertEqual(sb["binding"]["isolation"], "firecracker")
        fake_id = sb["binding"]["providerId"]
        st, _, fsb = self.fake_sandbox(fake_id)
        self.assertEqual(st, 200, fsb)
        # Our labels are on the provider's resource (list() finds it by them).
        self.assertEqual(fsb["metadata"].get("osr.dev/sandbox-id"), sb["id"])
        self.assertEqual(fsb["metadata"].get("osr.dev/tenant"), "outer-tenant")
        self.assertEqual(fsb["metadata"].get("osr.dev/managed"), "true")
        self.assertEqual(fsb["metadata"].get("k"), "v")
        fake_tok = fsb["envdAccessToken"]
        self.assertTrue(fake_tok)

        # The client never holds the fake's token: not in the answer, not in
        # the readable claims of its own token, not in a fresh GET.
        outer_tok = sb["token"]
        self.assertNotIn(fake_tok, json.dumps(sb))
        self.assertNotIn(fake_tok.encode(), token_claims_text(outer_tok))
        st, _, again = self.outer.call("GET", "/v1/sandboxes/" + sb["id"], key=key)
        self.assertEqual(st, 200)
        self.assertNotIn(fake_tok, json.dumps(again))

        # 2. Plain envd HTTP through the OUTER data plane with the OUTER
        # token: upload, download, a unary Connect call.
        dp = self.outer.dp_port
        hdr = {"E2b-Sandbox-Id": sb["id"], "E2b-Sandbox-Port": "49983",
               "X-Access-Token": outer_tok}
        st, _, _ = request(dp, "GET", "/health", headers=hdr)
        self.assertEqual(st, 204, self.logs())
        c = http.client.HTTPConnection("127.0.0.1", dp, timeout=60)
        c.request("POST", "/files?path=/tmp/plain.txt&username=user", body=b"plain bytes",
                  headers=dict(hdr, **{"Content-Type": "application/octet-stream"}))
        r = c.getresponse()
        r.read()
        c.close()
        self.assertEqual(r.status, 200, self.logs())
        st, _, got = request(dp, "GET", "/files?path=/tmp/plain.txt&username=user", headers=hdr)
        self.assertEqual((st, got), (200, "plain bytes"))
        st, _, stat = request(dp, "POST", "/filesystem.Filesystem/Stat",
                              {"path": "/tmp/plain.txt"},
                              dict(hdr, **{"Connect-Protocol-Version": "1"}))
        self.assertEqual(st, 200, stat)
        self.assertEqual(int(stat["entry"]["size"]), len(b"plain bytes"))

        # The outer token is worthless at the fake (it verifies with its own
        # keys), so the passthrough above must have sent the fake's token;
        # and the fake's own token works there directly.
        fhdr = {"E2b-Sandbox-Id": fake_id, "E2b-Sandbox-Port": "49983"}
        st, _, j = request(self.fake.tls_port, "GET", "/files?path=/tmp/plain.txt&username=user",
                           headers=dict(fhdr, **{"X-Access-Token": outer_tok}),
                           tls_ca=self.certs.ca)
        self.assertEqual(st, 401, j)
        st, _, got = request(self.fake.tls_port, "GET", "/files?path=/tmp/plain.txt&username=user",
                             headers=dict(fhdr, **{"X-Access-Token": fake_tok}),
                             tls_ca=self.certs.ca)
        self.assertEqual((st, got), (200, "plain bytes"))
        # A port other than envd goes to the provider's port proxy with the
        # provider's sandbox id and without the client's token: the fake
        # answers for ITS sandbox id (E2B would send no credential either
        # unless a traffic token was issued; the fake's proxy wants one).
        st, _, j = request(dp, "GET", "/", headers=dict(hdr, **{"E2b-Sandbox-Port": "8123"}))
        self.assertEqual(st, 401, j)
        self.assertEqual(j.get("sandboxId"), fake_id, j)
        self.assertNotIn(outer_tok, self.fake.dp.stderr_text())
        # A WebSocket upgrade to that port goes the same way: straight to the
        # provider (TLS, its Host form, no agent), without the client's token.
        # The fake's port proxy refuses it (no traffic token: see above), and
        # a refused upgrade is reported, not relayed: 502 naming the answer.
        ws = socket.create_connection(("127.0.0.1", dp), timeout=30)
        ws.sendall(("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                    "E2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 8123\r\nX-Access-Token: %s\r\n\r\n"
                    % (sb["id"], outer_tok)).encode())
        got = b""
        while b"\r\n\r\n" not in got or len(got) < 200:
            d = ws.recv(4096)
            if not d:
                break
            got += d
        ws.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 502"), got[:300])
        self.assertIn(b"answered the upgrade with HTTP 401", got, got[:500])
        # It reached the fake's port proxy with no token at all (the outer's
        # would have been refused as signed by an unknown key).
        self.assertIn("GET /ws refused 401: missing access token", self.fake.dp.stderr_text())
        self.assertNotIn(outer_tok, self.fake.dp.stderr_text())

        # 3. The real e2b SDK through the outer (E2B front door + data plane).
        env = {"E2B_API_URL": "http://127.0.0.1:%d" % self.outer.port,
               "E2B_SANDBOX_URL": "http://127.0.0.1:%d" % dp, "E2B_API_KEY": key,
               "NODE_PATH": osrtest.node_modules()}
        cp = osrtest.sh(["node", os.path.join(HERE, "e2b_provider.js")], env=env, timeout=240,
                        check=False)
        out = cp.stdout.decode("utf-8", "replace")
        err = cp.stderr.decode("utf-8", "replace")
        self.assertEqual(cp.returncode, 0, out + err + self.logs())
        m = re.search(r"E2B-PROVIDER-OK (\S+)", out)
        self.assertIsNotNone(m, out)
        sdk_id = m.group(1)
        st, _, sdk_sb = self.outer.call("GET", "/v1/sandboxes/" + sdk_id, key=key)
        self.assertEqual(st, 200, sdk_sb)
        self.assertEqual(sdk_sb["binding"]["provider"], "e2b")
        sdk_fake_id = sdk_sb["binding"]["providerId"]
        # The file the SDK wrote is in the fake's sandbox.
        st, _, fsdk = self.fake_sandbox(sdk_fake_id)
        self.assertEqual(st, 200, fsdk)
        st, _, got = request(self.fake.tls_port, "GET",
                             "/files?path=/tmp/from-sdk.txt&username=user",
                             headers={"E2b-Sandbox-Id": sdk_fake_id, "E2b-Sandbox-Port": "49983",
                                      "X-Access-Token": fsdk["envdAccessToken"]},
                             tls_ca=self.certs.ca)
        self.assertEqual((st, got), (200, "written by the sdk"))

        # 4. Kill through the outer gateway destroys both in the fake.
        for sid, fid in ((sb["id"], fake_id), (sdk_id, sdk_fake_id)):
            st, _, j = self.outer.call("DELETE", "/v1/sandboxes/" + sid, key=key)
            self.assertEqual(st, 204, str(j) + self.logs())
            st, _, j = self.fake_sandbox(fid)
            self.assertEqual(st, 404, j)
        # ... and the binding's token no longer reaches anything.
        st, _, _ = request(dp, "GET", "/health", headers=hdr)
        self.assertIn(st, (401, 502))


class AuthNoFailover(Base, unittest.TestCase):
    def test_wrong_key_is_auth_and_not_retried(self):
        bad = os.path.join(tempfile.mkdtemp(prefix="osr-e2bprov-key-"), "bad.key")
        with open(bad, "w") as f:
            f.write("e2b_" + "0" * 40 + "\n")

        def providers(base):
            wrong = dict(base, name="e2b-wrong-key")
            del wrong["api_key"]
            wrong["api_key_file"] = bad
            return [wrong, base]

        try:
            self.start_outer(outer_cfg(self.fake, providers, {"policy": {"strategy": "order"}}))
            st, _, j = self.outer.call("POST", "/v1/sandboxes", {"template": "base"})
            self.assertEqual(st, 502, j)
            # Exactly one attempt, on the wrong key, classed auth: no
            # failover to the second (good) provider.
            attempts = j["error"]["attempts"]
            self.assertEqual([(a["provider"], a["error"]) for a in attempts],
                             [("e2b-wrong-key", "auth")], j)
            st, _, lst = self.fake.api("GET", "/v2/sandboxes")
            self.assertEqual((st, lst), (200, []), self.logs())
            # The same create, pinned to the good provider, works: the
            # fake was reachable all along.
            st, _, ok = self.outer.call("POST", "/v1/sandboxes",
                                        {"template": "base", "policy": {"strategy": "pin:e2b"}})
            self.assertEqual(st, 201, str(ok) + self.logs())
            self.assertEqual(ok["binding"]["provider"], "e2b")
            st, _, _ = self.outer.call("DELETE", "/v1/sandboxes/" + ok["id"])
            self.assertEqual(st, 204)
            self.assertNotIn(self.fake.key, self.outer.log())
            self.assertNotIn("0" * 40, self.outer.log())
        finally:
            shutil.rmtree(os.path.dirname(bad), ignore_errors=True)


class OrphanList(Base, unittest.TestCase):
    def test_labelled_orphan_is_found_and_destroyed(self):
        # A sandbox in the fake that carries OSR's labels but has no binding
        # in the outer (what a gateway crash between the provider's accept
        # and our store write leaves): list() must find it, and the reaper
        # destroys it as an orphan. An unlabelled one is left alone.
        st, _, orphan = self.fake.api("POST", "/v2/sandboxes", {
            "templateID": "base", "timeout": 300,
            "metadata": {"osr.dev/managed": "true", "osr.dev/sandbox-id": "orphan00000000000001",
                         "osr.dev/tenant": "t"}})
        self.assertEqual(st, 201, orphan)
        st, _, other = self.fake.api("POST", "/v2/sandboxes", {"templateID": "base",
                                                                "timeout": 300,
                                                                "metadata": {"mine": "yes"}})
        self.assertEqual(st, 201, other)
        self.start_outer(outer_cfg(self.fake, None, {"reaper": {"interval_ms": 200}}))
        gone = False
        end = time.time() + 60
        while time.time() < end and not gone:
            st, _, _ = self.fake_sandbox(orphan["sandboxID"])
            gone = st == 404
            if not gone:
                time.sleep(0.2)
        self.assertTrue(gone, self.logs())
        self.assertIn("orphan", self.outer.log())
        st, _, j = self.fake_sandbox(other["sandboxID"])
        self.assertEqual(st, 200, j)
        st, _, _ = self.fake.api("DELETE", "/sandboxes/" + other["sandboxID"])
        self.assertEqual(st, 204)


def unread_bytes_to(port):
    """Bytes waiting in established loopback TCP connections to `port`
    (/proc/net/tcp rx_queue): a request a frozen server has not read."""
    total = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for ln in f:
            parts = ln.split()
            lport = int(parts[1].split(":")[1], 16)
            if lport == port and parts[3] == "01":
                total += int(parts[4].split(":")[1], 16)
    return total


class Recovery(Base, unittest.TestCase):
    """kill -9 of the outer gateway between the intent row and E2B's
    answer. The created sandbox is then known to the fake only (list() finds
    it by its label) and E2B's ListedSandbox has no envdAccessToken, so
    recovery must complete it through adopt() (SandboxDetail, sealed with the
    agent token) for the data plane to reach it."""

    outer_stopped = False

    def tearDown(self):
        if self.outer_stopped:  # a failed assertion left it frozen
            self.outer.kill9()
            self.outer.restart()
        super().tearDown()

    def test_kill9_mid_create_adopts_working_sandbox(self):
        self.start_outer(outer_cfg(self.fake, None, {"reaper": {"interval_ms": 500}}))
        key = self.outer.new_key("outer-tenant")
        fake_pid = self.fake.srv.proc.p.pid
        outer_pid = self.outer.proc.p.pid
        # 1. The fake's API is frozen: the outer's create request waits in
        # its socket, the intent row is durable (state creating).
        os.kill(fake_pid, signal.SIGSTOP)
        result = {}

        def create():
            try:
                result["r"] = self.outer.call("POST", "/v1/sandboxes", {"template": "base"},
                                              key=key)
            except OSError as e:
                result["r"] = e  # the gateway is killed under this request
        t = threading.Thread(target=create, daemon=True)
        try:
            t.start()
            creating = []
            end = time.time() + 30
            while time.time() < end and not creating:
                st, _, j = self.outer.call("GET", "/v1/sandboxes?state=creating")
                self.assertEqual(st, 200, j)
                creating = j["items"]
                if not creating:
                    time.sleep(0.05)
            self.assertEqual(len(creating), 1, self.logs())
            sid = creating[0]["id"]
            # The intent row is written before the provider call: wait
            # until the create request sits unread in the fake's socket.
            end = time.time() + 30
            while time.time() < end and unread_bytes_to(self.fake.srv.port) == 0:
                time.sleep(0.02)
            self.assertGreater(unread_bytes_to(self.fake.srv.port), 0, self.logs())
            # 2. Freeze the outer, let the fake create; its answer never
            # gets read: the outer dies with the row still creating.
            os.kill(outer_pid, signal.SIGSTOP)
            self.outer_stopped = True
        finally:
            os.kill(fake_pid, signal.SIGCONT)
        labelled = []
        end = time.time() + 60
        while time.time() < end and not labelled:
            st, _, lst = self.fake.api("GET", "/v2/sandboxes")
            self.assertEqual(st, 200, lst)
            labelled = [x for x in lst if x.get("metadata", {}).get("osr.dev/sandbox-id") == sid]
            if not labelled:
                time.sleep(0.1)
        self.assertEqual(len(labelled), 1, self.logs())
        fake_id = labelled[0]["sandboxID"]
        self.assertNotIn("envdAccessToken", labelled[0])  # ListedSandbox: no token
        # The fake lists a sandbox while it still starts; its answer to the
        # (frozen) outer is written once it runs, i.e. once its detail
        # carries the envd token: that is the moment to kill.
        end = time.time() + 60
        detail = {}
        while time.time() < end and not detail.get("envdAccessToken"):
            st, _, detail = self.fake_sandbox(fake_id)
            if not detail.get("envdAccessToken"):
                time.sleep(0.1)
        self.assertTrue(detail.get("envdAccessToken"), detail)
        self.outer.kill9()
        self.outer_stopped = False
        t.join(15)
        self.assertIsInstance(result.get("r"), OSError)  # no answer ever came

        # 3. Restart on the same data dir: recovery adopts the fake's sandbox.
        self.outer.restart()
        st, _, sb = self.outer.call("GET", "/v1/sandboxes/" + sid)
        self.assertEqual(st, 200, str(sb) + self.logs())
        self.assertEqual(sb["state"], "running", sb)
        self.assertEqual(sb["binding"]["providerId"], fake_id)
        st, _, audit = self.outer.call("GET", "/v1/audit?limit=1000")
        self.assertEqual(st, 200, audit)
        self.assertIn(("recover.adopt", sid),
                      [(e["action"], e.get("sandboxId", e.get("target"))) for e in audit["items"]],
                      audit)

        # 4. It works through the OUTER data plane with a fresh OUTER token:
        # the sealed endpoint adopt() built carries the fake's own token.
        st, _, tk = self.outer.call("POST", "/v1/sandboxes/%s/tokens" % sid, {}, key=key)
        self.assertIn(st, (200, 201), tk)
        hdr = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-Access-Token": tk["token"]}
        dp = self.outer.dp_port
        c = http.client.HTTPConnection("127.0.0.1", dp, timeout=60)
        c.request("POST", "/files?path=/tmp/adopted.txt&username=user", body=b"after a crash",
                  headers=dict(hdr, **{"Content-Type": "application/octet-stream"}))
        r = c.getresponse()
        r.read()
        c.close()
        self.assertEqual(r.status, 200, self.logs())
        st, _, got = request(dp, "GET", "/files?path=/tmp/adopted.txt&username=user", headers=hdr)
        self.assertEqual((st, got), (200, "after a crash"), self.logs())
        st, _, stat = request(dp, "POST", "/filesystem.Filesystem/Stat",
                              {"path": "/tmp/adopted.txt"},
                              dict(hdr, **{"Connect-Protocol-Version": "1"}))
        self.assertEqual(st, 200, stat)
        self.assertEqual(int(stat["entry"]["size"]), len(b"after a crash"))

        # 5. Nothing created twice, nothing leaked: one sandbox in the fake,
        # one binding in the outer; kill removes it from the fake.
        st, _, lst = self.fake.api("GET", "/v2/sandboxes")
        self.assertEqual([x["sandboxID"] for x in lst], [fake_id], lst)
        st, _, all_sb = self.outer.call("GET", "/v1/sandboxes")
        self.assertEqual([x["id"] for x in all_sb["items"]], [sid], all_sb)
        st, _, _ = self.outer.call("DELETE", "/v1/sandboxes/" + sid, key=key)
        self.assertEqual(st, 204)
        st, _, lst = self.fake.api("GET", "/v2/sandboxes")
        self.assertEqual(lst, [], self.logs())


if __name__ == "__main__":
    osrtest.run()
