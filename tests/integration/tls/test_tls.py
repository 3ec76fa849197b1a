"""TLS (src/net/tls.c) against independent peers, with whichever backend the
build uses (OSR_TLS_BACKEND: BoringSSL or OpenSSL 3):

  SClient    `openssl s_client` against osr-testd: handshake, ALPN as asked,
             SNI, verification of our chain, TLS 1.2 minimum, plaintext HTTP
             over the tunnel, renegotiation refused
  Curl       curl --cacert against osr-testd over HTTP/1.1 and HTTP/2: small
             and large (20 MB) bodies byte-exact, multi-MB uploads echoed
  OurClient  osr-testc --tls against `openssl s_server -www` and node's
             https / http2.createSecureServer: verification on by default,
             wrong CA and wrong name fail with a certificate error, --insecure
             passes, SNI sent (not for IP literals), ALPN h2, big bodies both
             ways
  BadInput   garbage instead of a ClientHello, silent and truncated
             handshakes, a ClientHello fed one byte at a time (Python's ssl
             over a MemoryBIO), a flood of bad connections; the server keeps
             serving

Each TestCase class is one meson test (see meson.build)."""
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import unittest

import osrtest

TESTC = osrtest.TESTC
CERT_ERROR = -30002  # OSR_ECERT
BIG = 20000000


def s_client(port, *args, stdin=b"", timeout=20):
    """Run `openssl s_client` against 127.0.0.1:port; stdout+stderr as text."""
    cp = osrtest.sh(["openssl", "s_client", "-connect", "127.0.0.1:%d" % port] + list(args),
                    input=stdin, timeout=timeout, check=False)
    return cp.stdout.decode("utf-8", "replace") + cp.stderr.decode("utf-8", "replace")


def curl(certs, port, *args, timeout=120):
    """curl against https://localhost:port (resolved to 127.0.0.1)."""
    return osrtest.sh(["curl", "-sS", "--max-time", str(timeout), "--cacert", certs.ca,
                       "--resolve", "localhost:%d:127.0.0.1" % port] + [str(a) for a in args],
                      timeout=timeout + 10, check=False)


def testc(*args, timeout=60):
    """osr-testc; returns (exit code, stdout text, stderr text)."""
    cp = osrtest.sh([TESTC] + [str(a) for a in args], timeout=timeout, check=False)
    return cp.returncode, cp.stdout.decode("utf-8", "replace"), cp.stderr.decode("utf-8", "replace")


def testc_fields(out):
    """'status 200' / 'body-bytes N' lines of osr-testc into a dict."""
    d = {}
    for ln in out.splitlines():
        k, _, v = ln.partition(" ")
        if k in ("version", "status", "body-bytes", "body-sha256", "error"):
            d.setdefault(k, v)
    return d


def sha256(b):
    return hashlib.sha256(b).hexdigest()


class ServerCase(unittest.TestCase):
    """One osr-testd with TLS per class (debug log on: it names the SNI)."""

    extra = ()

    @classmethod
    def setUpClass(cls):
        cls.certs = osrtest.Certs()
        cls.srv = osrtest.Testd("--log-level", "debug", *cls.extra, tls=cls.certs)
        cls.port = cls.srv.port

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        cls.certs.cleanup()
        # A sanitizer report makes osr-testd exit non-zero.
        if rc not in (0, -signal.SIGTERM):
            raise AssertionError("osr-testd exited with %s:\n%s" % (rc, cls.srv.proc.stderr_text()[-4000:]))

    def assertServes(self):
        """The server still answers a normal HTTPS request."""
        cp = curl(self.certs, self.port, "--http1.1", "https://localhost:%d/hello" % self.port)
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(cp.stdout, b"hello world\n")
        self.assertTrue(self.srv.proc.alive())


# ---------------------------------------------------------------------------


class SClient(ServerCase):
    """openssl s_client against osr-testd."""

    def handshake(self, *args, stdin=b""):
        return s_client(self.port, "-servername", "localhost", "-CAfile", self.certs.ca,
                        "-verify_return_error", *args, stdin=stdin)

    def test_alpn_h2(self):
        out = self.handshake("-alpn", "h2")
        self.assertIn("ALPN protocol: h2", out)
        self.assertIn("Verify return code: 0 (ok)", out)

    def test_alpn_http11(self):
        out = self.handshake("-alpn", "http/1.1")
        self.assertIn("ALPN protocol: http/1.1", out)

    def test_alpn_server_preference(self):
        # The client prefers http/1.1; the server's list ({h2, http/1.1}) decides.
        out = self.handshake("-alpn", "http/1.1,h2")
        self.assertIn("ALPN protocol: h2", out)

    def test_alpn_no_overlap(self):
        # Nothing in common: the handshake goes on without ALPN.
        out = self.handshake("-alpn", "spdy/3")
        self.assertIn("No ALPN negotiated", out)
        self.assertIn("Verify return code: 0 (ok)", out)

    def test_sni_recorded(self):
        out = self.handshake("-alpn", "http/1.1")
        self.assertIn("Verify return code: 0 (ok)", out)
        # osr-testd logs each handshake with the SNI the client sent.
        end = time.time() + 10
        while "sni=localhost" not in self.srv.proc.stderr_text() and time.time() < end:
            time.sleep(0.05)
        self.assertIn("sni=localhost", self.srv.proc.stderr_text())

    def test_verify_chain_and_names(self):
        for args in (("-verify_hostname", "localhost"), ("-verify_ip", "127.0.0.1")):
            out = self.handshake(*args)
            self.assertIn("Verify return code: 0 (ok)", out, args)
        out = self.handshake("-verify_hostname", "other.example")
        self.assertNotIn("Verify return code: 0 (ok)", out)

    def test_http_over_s_client(self):
        req = b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        out = self.handshake("-quiet", "-alpn", "http/1.1", stdin=req)
        self.assertIn("HTTP/1.1 200", out)
        self.assertIn("hello world", out)
        # Without ALPN the connection speaks HTTP/1.1 too.
        out = self.handshake("-quiet", stdin=req)
        self.assertIn("hello world", out)

    def test_tls12_ok_tls11_refused(self):
        out = self.handshake("-tls1_2", "-alpn", "http/1.1")
        self.assertIn("Protocol  : TLSv1.2", out)
        self.assertIn("Verify return code: 0 (ok)", out)
        out = s_client(self.port, "-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0")
        self.assertIn("Cipher is (NONE)", out)
        self.assertRegex(out, r"alert protocol version|no protocols available|wrong version|unsupported protocol")
        self.assertServes()

    def test_body_over_tls12(self):
        req = b"GET /bytes?n=100000 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        cp = osrtest.sh(["openssl", "s_client", "-connect", "127.0.0.1:%d" % self.port, "-quiet",
                         "-tls1_2", "-alpn", "http/1.1", "-servername", "localhost"],
                        input=req, check=False, timeout=30)
        body = cp.stdout.split(b"\r\n\r\n", 1)[1]
        self.assertEqual(body, osrtest.pattern(100000))

    def test_renegotiation_refused(self):
        # "R" asks s_client to renegotiate (TLS 1.2); the server refuses and
        # the connection ends, and the server keeps serving.
        p = subprocess.Popen(["openssl", "s_client", "-connect", "127.0.0.1:%d" % self.port, "-tls1_2",
                              "-alpn", "http/1.1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        try:
            out, _ = p.communicate(b"R\n", timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        text = out.decode("utf-8", "replace")
        self.assertIn("RENEGOTIATING", text)
        self.assertRegex(text, r"(?i)no renegotiation|alert")
        self.assertServes()


# ---------------------------------------------------------------------------


class Curl(ServerCase):
    """curl --cacert against osr-testd, HTTP/1.1 and HTTP/2 over TLS."""

    def test_hello(self):
        url = "https://localhost:%d/hello" % self.port
        for flag, version in (("--http1.1", "1.1"), ("--http2", "2")):
            cp = curl(self.certs, self.port, flag, "-w", "\n%{http_version}", url)
            self.assertEqual(cp.returncode, 0, cp.stderr)
            self.assertEqual(cp.stdout, b"hello world\n\n" + version.encode(), flag)

    def test_large_download(self):
        want = sha256(osrtest.pattern(BIG))
        url = "https://localhost:%d/bytes?n=%d" % (self.port, BIG)
        for flag in ("--http1.1", "--http2"):
            with tempfile.NamedTemporaryFile(prefix="osr-tls-") as f:
                cp = curl(self.certs, self.port, flag, "-o", f.name, url)
                self.assertEqual(cp.returncode, 0, cp.stderr)
                self.assertEqual(os.path.getsize(f.name), BIG, flag)
                with open(f.name, "rb") as r:
                    self.assertEqual(sha256(r.read()), want, flag)

    def test_echo_upload(self):
        data = os.urandom(6 * 1024 * 1024 + 123)
        url = "https://localhost:%d/echo" % self.port
        for flag in ("--http1.1", "--http2"):
            with tempfile.NamedTemporaryFile(prefix="osr-tls-") as f:
                f.write(data)
                f.flush()
                cp = curl(self.certs, self.port, flag, "--data-binary", "@" + f.name,
                          "-H", "Content-Type: application/octet-stream", url)
                self.assertEqual(cp.returncode, 0, cp.stderr)
                self.assertEqual(len(cp.stdout), len(data), flag)
                self.assertEqual(sha256(cp.stdout), sha256(data), flag)

    def test_parallel_connections(self):
        # Several connections at once, each with its own handshake.
        url = "https://localhost:%d/bytes?n=300000" % self.port
        procs = [subprocess.Popen(["curl", "-sS", "--cacert", self.certs.ca, "--resolve",
                                   "localhost:%d:127.0.0.1" % self.port, flag, url],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for flag in ("--http1.1", "--http2") * 8]
        want = osrtest.pattern(300000)
        for p in procs:
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, err)
            self.assertEqual(out, want)

    def test_wrong_ca_rejected_by_curl(self):
        other = osrtest.Certs()
        try:
            cp = osrtest.sh(["curl", "-sS", "--cacert", other.ca, "--resolve",
                             "localhost:%d:127.0.0.1" % self.port, "https://localhost:%d/hello" % self.port],
                            check=False)
            self.assertEqual(cp.returncode, 60, cp.stderr)  # peer certificate cannot be authenticated
        finally:
            other.cleanup()
        self.assertServes()


# ---------------------------------------------------------------------------
# our client against openssl s_server and node

NODE_SERVER = r"""
const fs = require('fs');
const crypto = require('crypto');
const mode = process.argv[2];
const opts = {key: fs.readFileSync(process.argv[3]), cert: fs.readFileSync(process.argv[4])};
function handler(req, res) {
  const u = new URL(req.url, 'https://x');
  const sock = req.socket || (req.stream && req.stream.session && req.stream.session.socket);
  const info = {servername: sock.servername || null, alpn: sock.alpnProtocol || null,
                version: req.httpVersion};
  if (u.pathname === '/big') {
    const n = +u.searchParams.get('n'); const b = Buffer.alloc(n);
    for (let i = 0; i < n; i++) b[i] = (i * 7 + 3) & 255;
    res.setHeader('content-length', n); res.end(b); return;
  }
  if (u.pathname === '/sink') {
    const h = crypto.createHash('sha256'); let n = 0;
    req.on('data', d => { n += d.length; h.update(d); });
    req.on('end', () => { info.bytes = n; info.sha256 = h.digest('hex'); res.end(JSON.stringify(info)); });
    return;
  }
  res.end(JSON.stringify(info));
}
let srv;
if (mode === 'h2') {
  srv = require('http2').createSecureServer(Object.assign({allowHTTP1: true}, opts), handler);
} else {
  srv = require('https').createServer(opts, handler);
}
srv.listen(0, '127.0.0.1', () => { console.log('listening ' + srv.address().port); });
process.on('SIGTERM', () => process.exit(0));
"""


def node_big(n):
    """The server's /big body: byte i = (i*7 + 3) mod 256 (period 256)."""
    blk = bytes(((i * 7 + 3) & 255) for i in range(256))
    return (blk * (n // 256 + 1))[:n]


@unittest.skipUnless(osrtest.have("openssl"), "openssl CLI not installed")
class OurClient(unittest.TestCase):
    """osr-testc --tls against openssl s_server -www and node https/http2."""

    @classmethod
    def setUpClass(cls):
        cls.certs = osrtest.Certs()
        cls.other = osrtest.Certs()  # a different CA
        cls.procs = []
        p = osrtest.Proc(["openssl", "s_server", "-accept", "127.0.0.1:0", "-cert", cls.certs.cert,
                          "-key", cls.certs.key, "-www", "-naccept", "1000"])
        ln = p.wait_line("ACCEPT", timeout=15)
        cls.s_server_port = int(ln.rsplit(":", 1)[1])
        cls.procs.append(p)
        cls.node_port = {}
        if osrtest.have("node"):
            d = tempfile.mkdtemp(prefix="osr-tls-node-")
            cls.node_dir = d
            js = os.path.join(d, "server.js")
            with open(js, "w") as f:
                f.write(NODE_SERVER)
            for mode in ("h1", "h2"):
                p = osrtest.Proc(["node", js, mode, cls.certs.key, cls.certs.cert])
                cls.node_port[mode] = int(p.wait_line("listening ", timeout=15).split()[1])
                cls.procs.append(p)

    @classmethod
    def tearDownClass(cls):
        for p in cls.procs:
            p.stop()
        cls.certs.cleanup()
        cls.other.cleanup()
        if getattr(cls, "node_dir", None):
            shutil.rmtree(cls.node_dir, ignore_errors=True)

    def need_node(self):
        if not self.node_port:
            self.skipTest("node not installed")

    def s_server(self, *args):
        return testc(*(list(args) + ["127.0.0.1:%d" % self.s_server_port, "/"]))

    def test_s_server_verified(self):
        rc, out, err = self.s_server("--tls", "--ca", self.certs.ca, "--sni", "localhost")
        f = testc_fields(out)
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(f.get("status"), "200")
        self.assertGreater(int(f["body-bytes"]), 0)

    def test_s_server_ip_literal_verified(self):
        # No --sni: the host is 127.0.0.1, checked against the IP SAN.
        rc, out, err = self.s_server("--tls", "--ca", self.certs.ca)
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(testc_fields(out).get("status"), "200")

    def test_wrong_ca_fails(self):
        rc, out, _ = self.s_server("--tls", "--ca", self.other.ca, "--sni", "localhost")
        self.assertEqual(rc, 1)
        self.assertEqual(int(testc_fields(out)["error"].split()[0]), CERT_ERROR, out)

    def test_system_store_rejects_test_ca(self):
        # Verification is on by default: without --ca the system store is used
        # and our throwaway CA is not in it.
        rc, out, _ = self.s_server("--tls", "--sni", "localhost")
        self.assertEqual(rc, 1)
        self.assertEqual(int(testc_fields(out)["error"].split()[0]), CERT_ERROR, out)

    def test_wrong_name_fails(self):
        rc, out, _ = self.s_server("--tls", "--ca", self.certs.ca, "--sni", "other.example")
        self.assertEqual(rc, 1)
        self.assertEqual(int(testc_fields(out)["error"].split()[0]), CERT_ERROR, out)
        rc, out, _ = self.s_server("--tls", "--ca", self.certs.ca, "--sni", "127.0.0.2")
        self.assertEqual(rc, 1)
        self.assertEqual(int(testc_fields(out)["error"].split()[0]), CERT_ERROR, out)

    def test_insecure_passes(self):
        rc, out, err = self.s_server("--tls", "--insecure", "--ca", self.other.ca, "--sni", "other.example")
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(testc_fields(out).get("status"), "200")

    def node(self, mode, *args, target="/"):
        return testc(*(list(args) + ["127.0.0.1:%d" % self.node_port[mode], target]))

    def node_json(self, out):
        body = [ln for ln in out.splitlines() if ln.startswith("{")]
        return json.loads(body[0]) if body else None

    def test_node_https_h1_sni(self):
        self.need_node()
        with tempfile.NamedTemporaryFile(prefix="osr-tls-") as f:
            rc, out, err = self.node("h1", "--tls", "--ca", self.certs.ca, "--sni", "localhost", "--out", f.name)
            self.assertEqual(rc, 0, out + err)
            info = json.loads(open(f.name).read())
        self.assertEqual(testc_fields(out).get("version"), "11")
        self.assertEqual(info["servername"], "localhost")
        self.assertEqual(info["alpn"], "http/1.1")

    def test_node_no_sni_for_ip_literal(self):
        self.need_node()
        with tempfile.NamedTemporaryFile(prefix="osr-tls-") as f:
            rc, out, err = self.node("h1", "--tls", "--ca", self.certs.ca, "--out", f.name)
            self.assertEqual(rc, 0, out + err)
            info = json.loads(open(f.name).read())
        self.assertIn(info["servername"], (None, False))

    def test_node_http2_alpn_h2(self):
        self.need_node()
        with tempfile.NamedTemporaryFile(prefix="osr-tls-") as f:
            rc, out, err = self.node("h2", "--h2", "--tls", "--ca", self.certs.ca, "--sni", "localhost",
                                     "--out", f.name)
            self.assertEqual(rc, 0, out + err)
            info = json.loads(open(f.name).read())
        self.assertEqual(testc_fields(out).get("version"), "20", out)
        self.assertEqual(info["alpn"], "h2")
        self.assertEqual(info["version"], "2.0")
        # Offering only http/1.1 to the same server gets HTTP/1.1.
        with tempfile.NamedTemporaryFile(prefix="osr-tls-") as f:
            rc, out, err = self.node("h2", "--tls", "--ca", self.certs.ca, "--sni", "localhost", "--out", f.name)
            self.assertEqual(rc, 0, out + err)
            info = json.loads(open(f.name).read())
        self.assertEqual(testc_fields(out).get("version"), "11", out)
        self.assertEqual(info["alpn"], "http/1.1")

    def test_node_big_download(self):
        self.need_node()
        n = 8 * 1024 * 1024 + 5
        want = sha256(node_big(n))
        for mode, flags in (("h1", ["--tls"]), ("h2", ["--h2", "--tls"])):
            rc, out, err = self.node(mode, *(flags + ["--ca", self.certs.ca, "--sni", "localhost"]),
                                     target="/big?n=%d" % n)
            f = testc_fields(out)
            self.assertEqual(rc, 0, out + err)
            self.assertEqual(int(f["body-bytes"]), n, mode)
            self.assertEqual(f["body-sha256"], want, mode)

    def test_node_big_upload(self):
        self.need_node()
        data = os.urandom(5 * 1024 * 1024 + 77)
        with tempfile.NamedTemporaryFile(prefix="osr-tls-") as src:
            src.write(data)
            src.flush()
            for mode, flags in (("h1", ["--tls"]), ("h2", ["--h2", "--tls"])):
                with tempfile.NamedTemporaryFile(prefix="osr-tls-") as f:
                    rc, out, err = self.node(mode, *(flags + ["--ca", self.certs.ca, "--sni", "localhost",
                                                              "--data-file", src.name, "--out", f.name]),
                                             target="/sink")
                    self.assertEqual(rc, 0, out + err)
                    info = json.loads(open(f.name).read())
                self.assertEqual(info["bytes"], len(data), mode)
                self.assertEqual(info["sha256"], sha256(data), mode)


# ---------------------------------------------------------------------------


def client_hello(host="localhost"):
    """The bytes of a real ClientHello (Python's ssl, i.e. OpenSSL)."""
    ctx = ssl.create_default_context()
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=host)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


class BadInput(ServerCase):
    """Hostile and broken handshakes; the server drops them and keeps serving.
    The handshake timeout is short (osr-testd's header timeout)."""

    extra = ("--header-timeout-ms", "500")

    def closed_by_server(self, s, limit=10.0):
        """Read until the server closes; return what it sent (an alert at most)."""
        s.settimeout(limit)
        got = b""
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                got += b
        except ConnectionResetError:
            pass
        except socket.timeout:
            self.fail("the server did not close the connection")
        return got

    def assertAlertOrNothing(self, got):
        # A TLS alert record (type 21) or nothing; never anything else.
        self.assertTrue(got == b"" or got[:1] == b"\x15", got[:64])

    def test_garbage_instead_of_client_hello(self):
        for junk in (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", os.urandom(4096), b"\x00" * 64,
                     b"\x16\x03\x01\xff\xff" + os.urandom(300), b"\x17\x03\x03\x00\x10" + b"x" * 16):
            s = socket.create_connection(("127.0.0.1", self.port))
            s.sendall(junk)
            self.assertAlertOrNothing(self.closed_by_server(s))
            s.close()
        self.assertServes()

    def test_silent_client_dropped(self):
        s = socket.create_connection(("127.0.0.1", self.port))
        self.assertEqual(self.closed_by_server(s), b"")
        s.close()
        self.assertServes()

    def test_truncated_handshake(self):
        hello = client_hello()
        self.assertGreater(len(hello), 100)
        # Half a ClientHello, then FIN: the handshake fails at once.
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(hello[: len(hello) // 2])
        s.shutdown(socket.SHUT_WR)
        self.assertAlertOrNothing(self.closed_by_server(s))
        s.close()
        # Half a ClientHello, then silence: dropped by the handshake timeout.
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(hello[: len(hello) // 2])
        self.assertAlertOrNothing(self.closed_by_server(s))
        s.close()
        # A whole ClientHello, then silence (the client never finishes).
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(hello)
        s.settimeout(10)
        first = s.recv(5)
        self.assertEqual(first[:1], b"\x16")  # the ServerHello flight
        self.closed_by_server(s)
        s.close()
        self.assertServes()

    def test_flood_of_bad_connections(self):
        hello = client_hello()
        socks = []
        for i in range(60):
            s = socket.create_connection(("127.0.0.1", self.port))
            s.sendall([b"\x16\x03\x01", hello[:40], os.urandom(64)][i % 3])
            socks.append(s)
        # While they hang around, a real client still gets through.
        self.assertServes()
        for s in socks:
            self.closed_by_server(s)
            s.close()
        self.assertServes()


class Fragmented(ServerCase):
    """A whole handshake and request in one-byte TCP segments. Its own class:
    sent byte by byte with pauses it takes longer than BadInput's 500 ms
    handshake timeout allows on a loaded machine, and that timeout is not what
    this test is about."""

    extra = ("--header-timeout-ms", "10000")

    def test_client_hello_byte_by_byte(self):
        # A real handshake whose every record arrives in one-byte pieces.
        ctx = ssl.create_default_context(cafile=self.certs.ca)
        ctx.set_alpn_protocols(["http/1.1"])
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(inc, out, server_hostname="localhost")
        s = socket.create_connection(("127.0.0.1", self.port))
        s.settimeout(10)

        def pump_out(bytewise):
            data = out.read()
            if bytewise:
                for i in range(len(data)):
                    s.sendall(data[i:i + 1])
                    time.sleep(0.0005)
            elif data:
                s.sendall(data)

        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pump_out(True)
                b = s.recv(65536)
                self.assertTrue(b, "server closed during the handshake")
                inc.write(b)
        pump_out(True)
        self.assertEqual(tls.selected_alpn_protocol(), "http/1.1")
        tls.write(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        pump_out(True)
        resp = b""
        while True:
            try:
                chunk = tls.read(65536)
                if not chunk:
                    break
                resp += chunk
                continue
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                break
            b = s.recv(65536)
            if not b:
                break
            inc.write(b)
        s.close()
        self.assertTrue(resp.startswith(b"HTTP/1.1 200"), resp[:200])
        self.assertTrue(resp.endswith(b"hello world\n"), resp[-200:])



if __name__ == "__main__":
    osrtest.run()
