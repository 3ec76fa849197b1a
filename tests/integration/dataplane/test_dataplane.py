"""osr-dataplane integration tests: the real data plane in front of the real
osr-agent (unix socket, no access token: the data plane is its only client),
tokens minted with the real token module (dp-mint), real Redis for
revocations, curl / node ws / python clients. No gateway runs at all, which
is also the "gateway down" case: nothing here could reach one.

"No byte reaches the sandbox" is checked with a sentinel: refused tokens name
an agent endpoint that is a counting unix listener, which must see no
connection at all (and does see one for a valid token: the control)."""
import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "lib"))
import osrtest  # noqa: E402
import services  # noqa: E402

DP = os.environ.get("OSR_DATAPLANE", "")
AGENT = os.environ.get("OSR_AGENT", "")
MINT = os.environ.get("OSR_DP_MINT", "")
ENVD = 49983
SID = "sbx1"


def mint(keys, kid, sid, ep, scopes="exec,files,ports", ports="all", ttl=300):
    return osrtest.sh([MINT, "sign", keys, kid, sid, ep, scopes, ports, str(ttl)]).stdout.decode().strip()


def raw_http_backend(respond):
    """A keep-alive HTTP/1.1 server on raw sockets for requests without a
    body: respond(method, name) gives the response bytes for each request
    head (name: the target's last path segment). Returns the listening
    socket, its port and the list of accepted connections (close them all)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    accepted = []

    def serve(c):
        buf = b""
        with c:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, buf = buf.split(b"\r\n\r\n", 1)
                method, target = head.split(b" ")[:2]
                c.sendall(respond(method, target.rsplit(b"/", 1)[1].decode()))

    def accept_loop():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            accepted.append(c)
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    return lsock, lsock.getsockname()[1], accepted


class Sentinel:
    """A unix listener counting connections (a fake agent that must stay untouched)."""

    def __init__(self, path):
        self.path = path
        self.count = 0
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.bind(path)
        self.s.listen(64)
        self.s.settimeout(0.2)
        self.stop_ = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop_:
            try:
                c, _ = self.s.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.count += 1
            c.close()

    def close(self):
        self.stop_ = True
        self.t.join(2)
        self.s.close()


class Env:
    """Keys, an open osr-agent on a unix socket, osr-dataplane."""

    def __init__(self, extra=(), redis=None):
        self.dir = tempfile.mkdtemp(prefix="osr-dp-")
        self.keys = os.path.join(self.dir, "keys")
        self.other_keys = os.path.join(self.dir, "other")
        os.mkdir(self.keys)
        os.mkdir(self.other_keys)
        osrtest.sh([MINT, "genkey", self.keys, "k1"])
        osrtest.sh([MINT, "genkey", self.keys, "k2"])   # rotation: both verify
        osrtest.sh([MINT, "genkey", self.other_keys, "k9"])  # unknown to the data plane
        with open(os.path.join(self.keys, "active"), "w") as f:
            f.write("k1\n")
        self.sock = os.path.join(self.dir, "agent.sock")
        self.ep = "unix:" + self.sock
        self.agent = osrtest.Proc([AGENT, "--listen", "unix:" + self.sock, "--workdir", self.dir])
        self.agent.wait_line("ready")
        self.sentinel = Sentinel(os.path.join(self.dir, "sentinel.sock"))
        args = [DP, "--listen", "127.0.0.1:0", "--keys-dir", self.keys, "--domain", "sbx.test"]
        if redis is not None:
            args += ["--redis", redis]
        self.dp = osrtest.Proc(args + list(extra))
        try:
            ln = self.dp.wait_line("listening 127.0.0.1:0 ")
            self.port = int(ln.split()[-1])
            self.dp.wait_line("ready")
        except Exception:
            self.close()  # never leave the agent behind
            raise

    def token(self, sid=SID, scopes="exec,files,ports", ports="all", ttl=300, kid="k1", ep=None,
              keys=None):
        return mint(keys or self.keys, kid, sid, ep or self.ep, scopes, ports, ttl)

    def request(self, method, path, headers=None, body=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r, data

    def envd(self, method, path, tok, body=None, headers=None, sid=SID):
        h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(ENVD)}
        if tok is not None:
            h["X-Access-Token"] = tok
        h.update(headers or {})
        return self.request(method, path, h, body)

    def close(self):
        rc = self.dp.stop()
        self.agent.stop()
        self.sentinel.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


def frames(data):
    """Split a Connect stream body into (flags, json) envelopes."""
    out = []
    i = 0
    while i + 5 <= len(data):
        fl, n = struct.unpack(">BI", data[i:i + 5])
        out.append((fl, json.loads(data[i + 5:i + 5 + n] or b"{}")))
        i += 5 + n
    assert i == len(data), "trailing bytes in the stream"
    return out


def envelope(msg):
    b = json.dumps(msg).encode()
    return struct.pack(">BI", 0, len(b)) + b


class Base(unittest.TestCase):
    redis = None

    def setUp(self):
        self.env = Env(redis=self.redis.url if self.redis else None)

    def tearDown(self):
        rc = self.env.close()
        self.assertEqual(rc, 0, self.env.dp.stderr_text()[-3000:])


class Auth(Base):
    def refused(self, tok, path="/health", headers=None, sid=SID, want=401, method="GET", body=None):
        h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(ENVD)}
        if tok is not None:
            h["X-Access-Token"] = tok
        h.update(headers or {})
        r, data = self.env.request(method, path, h, body)
        self.assertEqual(r.status, want, data)
        self.assertEqual(r.getheader("content-type"), "application/json")
        json.loads(data)
        return data

    def test_refusals_reach_nothing(self):
        e = self.env
        s = e.sentinel.path
        ep = "unix:" + s
        good = e.token(ep=ep)
        tok = list(good)
        # Forged signature: flip one character of the signature part.
        i = len(tok) - 5
        tok[i] = "A" if tok[i] != "A" else "B"
        forged = "".join(tok)
        # Forged payload: another token's payload with this signature.
        other = e.token(sid="sbx2", ep=ep)
        spliced = other.rsplit(".", 1)[0] + "." + good.rsplit(".", 1)[1]
        cases = [
            ("missing", None, "/health", 401),
            ("garbage", "nope", "/health", 401),
            ("forged signature", forged, "/health", 401),
            ("forged payload", spliced, "/health", 401),
            ("expired", e.token(ttl=-60, ep=ep), "/health", 401),
            ("unknown kid", e.token(kid="k9", keys=e.other_keys, ep=ep), "/health", 401),
            ("wrong sandbox", e.token(sid="sbx2", ep=ep), "/health", 403),
            ("files token, exec path", e.token(scopes="files", ep=ep), "/process.Process/List", 403),
            ("exec token, files path", e.token(scopes="exec", ep=ep), "/files?path=/etc/hostname", 403),
            ("exec token, filesystem rpc", e.token(scopes="exec", ep=ep), "/filesystem.Filesystem/Stat",
             403),
            ("agent extension", good, "/_osr/ports/22", 403),
        ]
        for name, t, path, want in cases:
            with self.subTest(name):
                method = "POST" if "." in path.split("/")[1] else "GET"
                body = b"{}" if method == "POST" else None
                hdr = {"Content-Type": "application/json"} if body else {}
                self.refused(t, path, hdr, want=want, method=method, body=body)
        # Ports: no ports scope, and a port outside the list.
        for name, t in (("no ports scope", e.token(scopes="exec,files", ep=ep)),
                        ("port outside the list", e.token(scopes="ports", ports="8000,8001", ep=ep))):
            with self.subTest(name):
                r, data = e.request("GET", "/sbx/%s/9000/" % SID, {"X-Access-Token": t})
                self.assertEqual(r.status, 403, data)
        time.sleep(0.3)
        self.assertEqual(e.sentinel.count, 0, "a refused request reached the agent endpoint")
        # Control: the same endpoint with a valid token is reached.
        r, _ = e.request("GET", "/health", {"E2b-Sandbox-Id": SID, "E2b-Sandbox-Port": str(ENVD),
                                            "X-Access-Token": good})
        self.assertEqual(r.status, 502)
        deadline = time.time() + 5
        while e.sentinel.count == 0 and time.time() < deadline:
            time.sleep(0.05)
        self.assertGreaterEqual(e.sentinel.count, 1)

    def test_token_forms_and_rotation(self):
        e = self.env
        for kid in ("k1", "k2"):
            t = e.token(kid=kid)
            r, _ = e.envd("GET", "/health", t)
            self.assertEqual(r.status, 204, kid)
        t = e.token()
        r, _ = e.request("GET", "/health", {"E2b-Sandbox-Id": SID, "E2b-Sandbox-Port": str(ENVD),
                                            "Authorization": "Bearer " + t})
        self.assertEqual(r.status, 204)
        r, _ = e.request("GET", "/sbx/%s/%d/health?access_token=%s" % (SID, ENVD, t))
        self.assertEqual(r.status, 204)
        # Connect RPC paths get Connect-shaped errors.
        r, data = e.envd("POST", "/process.Process/List", None, b"{}", {"Content-Type": "application/json"})
        self.assertEqual(r.status, 401)
        self.assertEqual(json.loads(data)["code"], "unauthenticated")


class Routing(Base):
    def test_forms(self):
        e = self.env
        t = e.token()
        r, _ = e.envd("GET", "/health", t)
        self.assertEqual(r.status, 204)
        r, _ = e.request("GET", "/health", {"Host": "%d-%s.sbx.test" % (ENVD, SID), "X-Access-Token": t})
        self.assertEqual(r.status, 204)
        r, _ = e.request("GET", "/sbx/%s/%d/health" % (SID, ENVD), {"X-Access-Token": t})
        self.assertEqual(r.status, 204)
        r, data = e.request("GET", "/health", {"X-Access-Token": t})
        self.assertEqual(r.status, 400, data)
        r, data = e.request("GET", "/health", {"E2b-Sandbox-Id": "bad id!", "E2b-Sandbox-Port": "1",
                                               "X-Access-Token": t})
        self.assertEqual(r.status, 400, data)

    def test_unreachable_agent_is_502_e2b_json(self):
        e = self.env
        t = e.token(ep="unix:" + os.path.join(e.dir, "nobody.sock"))
        r, data = e.envd("POST", "/process.Process/List", t, b"{}", {"Content-Type": "application/json"})
        self.assertEqual(r.status, 502)
        self.assertEqual(json.loads(data), {"sandboxId": SID, "message": "The sandbox was not found",
                                            "code": 502})


class Envd(Base):
    def test_unary_and_server_stream(self):
        e = self.env
        t = e.token(scopes="exec,files")
        path = os.path.join(e.dir, "hello.txt")
        with open(path, "w") as f:
            f.write("hello")
        # Unary: the same bytes as asking the agent directly.
        body = json.dumps({"path": path}).encode()
        hdr = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        r, via = e.envd("POST", "/filesystem.Filesystem/Stat", t, body, hdr)
        self.assertEqual(r.status, 200, via)
        c = http.client.HTTPConnection("localhost", timeout=30)
        c.sock = socket.socket(socket.AF_UNIX)
        c.sock.connect(e.sock)
        c.request("POST", "/filesystem.Filesystem/Stat", body=body, headers=hdr)
        direct = c.getresponse().read()
        c.close()
        self.assertEqual(via, direct)
        self.assertEqual(json.loads(via)["entry"]["name"], "hello.txt")
        # Server stream: Start, frames flushed per chunk, ends with 0x02.
        msg = {"process": {"cmd": "/bin/sh", "args": ["-c", "printf 'a\\n'; sleep 0.3; printf 'b\\n'"]}}
        hdr = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
        conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=30)
        h = {"E2b-Sandbox-Id": SID, "E2b-Sandbox-Port": str(ENVD), "X-Access-Token": t}
        h.update(hdr)
        conn.request("POST", "/process.Process/Start", body=envelope(msg), headers=h)
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.getheader("content-type"), "application/connect+json")
        # The first frame arrives before the process ended: streamed, not buffered.
        first = resp.read(5)
        n = struct.unpack(">BI", first)[1]
        ev = json.loads(resp.read(n))
        self.assertIn("start", ev["event"])
        rest = resp.read()
        conn.close()
        fr = frames(rest)
        self.assertEqual(fr[-1][0], 2)
        out = b"".join(base64.b64decode(f[1]["event"]["data"]["stdout"]) for f in fr
                       if f[0] == 0 and "data" in f[1]["event"] and "stdout" in f[1]["event"]["data"])
        self.assertEqual(out, b"a\nb\n")
        ends = [f[1]["event"]["end"] for f in fr if f[0] == 0 and "end" in f[1]["event"]]
        self.assertEqual(len(ends), 1)


class Files(Base):
    def test_100mb_both_ways_byte_exact(self):
        e = self.env
        t = e.token(scopes="files")
        src = os.path.join(e.dir, "src.bin")
        data = os.urandom(1 << 20) * 100
        with open(src, "wb") as f:
            f.write(data)
        digest = hashlib.sha256(data).hexdigest()
        dst = os.path.join(e.dir, "up.bin")
        base = "http://127.0.0.1:%d/sbx/%s/%d/files?path=%s" % (e.port, SID, ENVD, dst)
        hdr = ["-H", "X-Access-Token: " + t]
        rss0 = e.dp.rss_kib()
        cp = osrtest.sh(["curl", "-sS", "--fail", "--max-time", "120", "-X", "POST", "-H",
                         "Content-Type: application/octet-stream", "--data-binary", "@" + src] + hdr + [base],
                        timeout=150)
        self.assertEqual(json.loads(cp.stdout)[0]["path"], dst)
        with open(dst, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest)
        # Chunked upload (no Content-Length) as well.
        dst2 = os.path.join(e.dir, "up2.bin")
        osrtest.sh(["curl", "-sS", "--fail", "--max-time", "120", "-X", "POST", "-H",
                    "Transfer-Encoding: chunked", "-H", "Content-Type: application/octet-stream",
                    "--data-binary", "@" + src] + hdr + [base.replace("up.bin", "up2.bin")], timeout=150)
        with open(dst2, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest)
        out = os.path.join(e.dir, "down.bin")
        osrtest.sh(["curl", "-sS", "--fail", "--max-time", "120", "-o", out] + hdr + [base], timeout=150)
        with open(out, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest)
        # Zero copy + backpressure: 300 MB moved, memory did not follow.
        self.assertLess(e.dp.rss_kib() - rss0, 32 * 1024)


class Ports(Base):
    def setUp(self):
        super().setUp()
        self.www = os.path.join(self.env.dir, "www")
        os.mkdir(self.www)
        self.blob = os.urandom(3 << 20)
        with open(os.path.join(self.www, "blob.bin"), "wb") as f:
            f.write(self.blob)
        self.hport = services.free_port()
        # HTTP/1.1 keep-alive, so pooled tunnels are exercised too.
        self.http = osrtest.Proc([sys.executable, "-m", "http.server", "--protocol", "HTTP/1.1", "--bind", "127.0.0.1",
                                  str(self.hport)], cwd=self.www)
        services._wait_port(self.hport)

    def tearDown(self):
        self.http.stop()
        super().tearDown()

    def test_http_through_the_tunnel(self):
        e = self.env
        t = e.token(scopes="ports", ports=str(self.hport))
        for via in ("path", "headers", "host"):
            with self.subTest(via):
                if via == "path":
                    r, data = e.request("GET", "/sbx/%s/%d/blob.bin" % (SID, self.hport), {"X-Access-Token": t})
                elif via == "headers":
                    r, data = e.request("GET", "/blob.bin", {"E2b-Sandbox-Id": SID,
                                                             "E2b-Sandbox-Port": str(self.hport),
                                                             "X-Access-Token": t})
                else:
                    r, data = e.request("GET", "/blob.bin", {"Host": "%d-%s.sbx.test" % (self.hport, SID),
                                                             "X-Access-Token": t})
                self.assertEqual(r.status, 200)
                self.assertEqual(data, self.blob)
        # Errors from the sandbox's server pass through unchanged.
        r, data = e.request("GET", "/sbx/%s/%d/missing" % (SID, self.hport), {"X-Access-Token": t})
        self.assertEqual(r.status, 404)
        # Nothing listening on the port: 502.
        t2 = e.token(scopes="ports", ports="all")
        dead = services.free_port()
        r, data = e.request("GET", "/sbx/%s/%d/" % (SID, dead), {"X-Access-Token": t2})
        self.assertEqual(r.status, 502, data)

    def test_hop_by_hop_response_headers_dropped(self):
        # The sandbox's Connection header and the headers it lists stay on
        # the upstream hop; "Connection: keep-alive" alone (the common case,
        # taken without scanning) drops Keep-Alive and nothing else.
        conns = {"keep": b"keep-alive", "list": b"keep-alive, X-Hop"}
        lsock, port, accepted = raw_http_backend(
            lambda method, which: b"HTTP/1.1 200 OK\r\nConnection: " + conns[which] +
            b"\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\nok")
        try:
            e = self.env
            t = e.token(scopes="ports", ports=str(port))
            for which, hop_kept in (("keep", True), ("list", False)):
                with self.subTest(which):
                    r, data = e.request("GET", "/sbx/%s/%d/%s" % (SID, port, which), {"X-Access-Token": t})
                    self.assertEqual(r.status, 200)
                    self.assertEqual(data, b"ok")
                    self.assertEqual(r.getheader("X-Kept"), "1")
                    self.assertIsNone(r.getheader("Keep-Alive"))
                    self.assertEqual(r.getheader("X-Hop") is not None, hop_kept)
        finally:
            lsock.close()
            for c in accepted:
                c.close()

    def test_response_ends_with_its_last_bytes_and_upstream_is_reused(self):
        # The proxy ends the client's response with the last bytes of a
        # Content-Length body (copied when they fit a pooled 4 KiB block, so
        # the upstream message completes at once; held in place otherwise)
        # and the upstream connection goes back to the pool either way.
        # Bodies whose last bytes are copied (and empty ones, HEAD, 204)
        # return the connection before the client even has the response, so
        # a run of them must use exactly one upstream connection.
        big = os.urandom(300000)

        def respond(method, name):
            if name == "nocontent":
                return b"HTTP/1.1 204 No Content\r\n\r\n"
            body = big[:int(name[1:])]
            return (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) +
                    (b"" if method == b"HEAD" else body))

        lsock, port, accepted = raw_http_backend(respond)
        try:
            e = self.env
            t = e.token(scopes="ports", ports=str(port))
            c = http.client.HTTPConnection("127.0.0.1", e.port, timeout=10)

            def get(name, method="GET"):
                c.request(method, "/sbx/%s/%d/%s" % (SID, port, name), headers={"X-Access-Token": t})
                r = c.getresponse()
                return r, r.read()

            for i in range(3):
                for n in (12, 0, 1, 4096, 200):
                    with self.subTest(i=i, n=n):
                        r, data = get("n%d" % n)
                        self.assertEqual(r.status, 200)
                        self.assertEqual(r.getheader("Content-Length"), str(n))
                        self.assertEqual(data, big[:n])
                r, data = get("n12", "HEAD")
                self.assertEqual((r.status, r.getheader("Content-Length"), data), (200, "12", b""))
                r, data = get("nocontent")
                self.assertEqual((r.status, data), (204, b""))
            self.assertEqual(len(accepted), 1)
            # Last bytes larger than the copy block: held in the upstream
            # connection's input until written; the exchange ends first and
            # the upstream request finishes on the next loop turns, so give
            # it a moment before the next request looks in the pool.
            for n in (4097, 70000, 300000):
                with self.subTest(n=n):
                    r, data = get("n%d" % n)
                    self.assertEqual(r.status, 200)
                    self.assertEqual(hashlib.sha256(data).hexdigest(), hashlib.sha256(big[:n]).hexdigest())
                time.sleep(0.2)
            r, data = get("n12")
            self.assertEqual(data, big[:12])
            self.assertEqual(len(accepted), 1)
            c.close()
        finally:
            lsock.close()
            for s in accepted:
                s.close()

    def test_keepalive_client_and_pooled_upstreams(self):
        # Several requests on one client connection, each reusing a pooled
        # upstream (agent connection / tunnel). Needs the http1_client fix
        # that resumes the parser after a released final chunk.
        e = self.env
        t = e.token(scopes="files,ports", ports=str(self.hport))
        for path, want in (("/sbx/%s/%d/blob.bin" % (SID, self.hport), self.blob),
                           ("/sbx/%s/%d/files?path=%s" % (SID, ENVD, os.path.join(self.www, "blob.bin")),
                            self.blob)):
            c = http.client.HTTPConnection("127.0.0.1", e.port, timeout=10)
            for i in range(5):
                with self.subTest(path=path, i=i):
                    c.request("GET", path, headers={"X-Access-Token": t})
                    r = c.getresponse()
                    self.assertEqual(r.status, 200)
                    self.assertEqual(r.read(), want)
            c.close()

    def test_http2_client(self):
        if not osrtest.have("curl"):
            self.skipTest("curl")
        e = self.env
        t = e.token(scopes="ports", ports=str(self.hport))
        out = os.path.join(e.dir, "h2.bin")
        cp = osrtest.sh(["curl", "-sS", "--fail", "--http2-prior-knowledge", "-o", out, "-w", "%{http_version}",
                         "-H", "X-Access-Token: " + t,
                         "http://127.0.0.1:%d/sbx/%s/%d/blob.bin" % (e.port, SID, self.hport)])
        self.assertEqual(cp.stdout.decode(), "2")
        with open(out, "rb") as f:
            self.assertEqual(f.read(), self.blob)

    def test_websocket_echo(self):
        nm = osrtest.node_modules()
        if nm is None or not osrtest.have("node"):
            self.skipTest("node ws")
        e = self.env
        wport = services.free_port()
        server = osrtest.Proc(["node", "-e", """
const {WebSocketServer} = require('ws');
const s = new WebSocketServer({host: '127.0.0.1', port: %d});
s.on('connection', (c, req) => { c.on('message', (m, bin) => c.send(m, {binary: bin})); });
s.on('listening', () => console.log('up'));
""" % wport], env={"NODE_PATH": nm})
        try:
            server.wait_line("up")
            t = e.token(scopes="ports", ports=str(wport))
            client = osrtest.sh(["node", "-e", """
const WebSocket = require('ws');
const crypto = require('crypto');
const ws = new WebSocket(process.argv[1]);
const msgs = [Buffer.from('hello'), crypto.randomBytes(1 << 20), Buffer.alloc(0)];
let i = 0;
ws.on('open', () => ws.send(msgs[0]));
ws.on('message', (m) => {
  if (!Buffer.from(m).equals(msgs[i])) { console.log('mismatch ' + i); process.exit(1); }
  if (++i === msgs.length) { console.log('echo ok'); ws.close(); } else ws.send(msgs[i]);
});
ws.on('error', (err) => { console.log('error ' + err.message); process.exit(1); });
""", "ws://127.0.0.1:%d/sbx/%s/%d/?access_token=%s" % (e.port, SID, wport, t)],
                env={"NODE_PATH": nm}, timeout=60)
            self.assertIn("echo ok", client.stdout.decode())
        finally:
            server.stop()


class Streams(Ports):
    def test_slow_client_does_not_grow_memory(self):
        e = self.env
        big = os.urandom(1 << 20) * 64
        with open(os.path.join(self.www, "big.bin"), "wb") as f:
            f.write(big)
        t = e.token(scopes="ports", ports=str(self.hport))
        s = socket.create_connection(("127.0.0.1", e.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.sendall(("GET /sbx/%s/%d/big.bin HTTP/1.1\r\nHost: x\r\nX-Access-Token: %s\r\n\r\n"
                   % (SID, self.hport, t)).encode())
        rss0 = e.dp.rss_kib()
        buf = bytearray()
        # Read slowly for a while: the data plane must stop the sandbox side.
        deadline = time.time() + 3
        while time.time() < deadline:
            chunk = s.recv(16384)
            if not chunk:
                break
            buf += chunk
            time.sleep(0.01)
        grown = e.dp.rss_kib() - rss0
        self.assertLess(len(buf), len(big) // 2, "the client was not slow enough to test anything")
        self.assertLess(grown, 16 * 1024, "memory grew with a slow reader: %d KiB" % grown)
        s.settimeout(60)
        while True:
            if b"\r\n\r\n" in buf and len(buf) - buf.index(b"\r\n\r\n") - 4 >= len(big):
                break
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
        s.close()
        hl = bytes(buf).index(b"\r\n\r\n") + 4
        self.assertEqual(hashlib.sha256(bytes(buf[hl:hl + len(big)])).digest(), hashlib.sha256(big).digest())

    def test_1000_concurrent_streams(self):
        e = self.env
        t = e.token(scopes="exec,files,ports")
        N = 1000
        path = os.path.join(e.dir, "small.txt")
        with open(path, "wb") as f:
            f.write(b"x" * 1000)
        req = ("GET /sbx/%s/%d/files?path=%s HTTP/1.1\r\nHost: x\r\nX-Access-Token: %s\r\n\r\n"
               % (SID, ENVD, path, t)).encode()
        socks = []
        for _ in range(N):
            s = socket.create_connection(("127.0.0.1", e.port), timeout=60)
            socks.append(s)
        for s in socks:
            s.sendall(req)
        ok = 0
        bad = []
        deadline = time.monotonic() + 60
        for i, s in enumerate(socks):
            buf = b""
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                while b"\r\n\r\n" not in buf or len(buf) - buf.index(b"\r\n\r\n") - 4 < 1000:
                    c = s.recv(65536)
                    if not c:
                        break
                    buf += c
            except socket.timeout:
                pass  # counted below; the others get what is left of the minute
            if buf.startswith(b"HTTP/1.1 200") and buf.endswith(b"x" * 1000):
                ok += 1
            elif len(bad) < 5:
                bad.append((i, buf[:120]))
            s.close()
        self.assertEqual(ok, N, "failed streams (index, first bytes): %r\ndata plane log:\n%s\nagent log:\n%s"
                         % (bad, e.dp.stderr_text()[-2000:], e.agent.stderr_text()[-2000:]))


class Revocation(unittest.TestCase):
    def test_killed_sandbox_refused_within_1s(self):
        with services.RedisServer() as redis:
            env = Env(redis=redis.url)
            try:
                t = env.token()
                r, _ = env.envd("GET", "/health", t)
                self.assertEqual(r.status, 204)
                time.sleep(0.5)  # the subscriber connects in the background
                redis.cli("PUBLISH", "osr:invalidate", SID)
                t0 = time.time()
                status = 204
                while time.time() - t0 < 1.0:
                    r, _ = env.envd("GET", "/health", t)
                    status = r.status
                    if status == 401:
                        break
                    time.sleep(0.02)
                self.assertEqual(status, 401)
                # Other sandboxes are unaffected.
                r, _ = env.envd("GET", "/health", env.token(sid="sbx2"), sid="sbx2")
                self.assertEqual(r.status, 204)
            finally:
                self.assertEqual(env.close(), 0)


if __name__ == "__main__":
    osrtest.run()
