"""HTTP/1.1 server (osr-testd) and client (osr-testc) against independent
peers: curl, raw Python sockets (malformed and malicious requests), node's
http module, and a scripted raw-socket server.

Each TestCase class is one meson test (see meson.build)."""
import hashlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import osrtest

TESTC = osrtest.TESTC

# ---------------------------------------------------------------------------
# helpers


def curl(*args, timeout=60):
    """Run curl; return (CompletedProcess, body bytes)."""
    cp = osrtest.sh(["curl", "-sS", "--max-time", str(timeout)] + [str(a) for a in args],
                    timeout=timeout + 10, check=False)
    return cp


def status_of(resp):
    """Status code of the first response in raw bytes, or None."""
    if not resp.startswith(b"HTTP/1."):
        return None
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def one_response(raw):
    """Parse one response (Content-Length or chunked framing) from the front
    of raw bytes: (status, headers, body, rest), or None if incomplete."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.split(b"\r\n")
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(b":")
        hdrs[k.strip().lower()] = v.strip()
    status = int(lines[0].split(b" ")[1])
    if hdrs.get(b"transfer-encoding") == b"chunked":
        body = b""
        while True:
            size_line, sep, after = rest.partition(b"\r\n")
            if not sep:
                return None
            n = int(size_line, 16)
            if n == 0:
                if len(after) < 2:
                    return None
                return status, hdrs, body, after[2:]
            if len(after) < n + 2:
                return None
            body += after[:n]
            rest = after[n + 2:]
    n = int(hdrs.get(b"content-length", b"0"))
    if len(rest) < n:
        return None
    return status, hdrs, rest[:n], rest[n:]


def responses(raw):
    """All complete responses at the front of raw: [(status, headers, body)]."""
    out = []
    while raw:
        r = one_response(raw)
        if r is None:
            break
        out.append(r[:3])
        raw = r[3]
    return out


def send_and_read(port, chunks, delay=0.0, timeout=8.0):
    """Send chunks from a thread (errors ignored: the server may close on
    us mid-send) while reading everything the server says until it closes
    or `timeout` passes. Returns (bytes, seconds until close or None)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    start = time.time()
    stop = threading.Event()

    def sender():
        try:
            for c in chunks:
                if stop.is_set():
                    return
                s.sendall(c)
                if delay:
                    time.sleep(delay)
        except OSError:
            pass

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    out = b""
    closed_after = None
    end = start + timeout
    try:
        while time.time() < end:
            s.settimeout(max(0.05, end - time.time()))
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                closed_after = time.time() - start
                break
            if not b:
                closed_after = time.time() - start
                break
            out += b
    finally:
        stop.set()
        s.close()
        t.join(5)
    return out, closed_after


class KeepConn:
    """A keep-alive connection that must keep working while other
    connections misbehave."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)

    def get(self, path="/hello"):
        self.s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n\r\n")
        buf = b""
        while True:
            r = responses(buf)
            if r:
                return r[0]
            b = self.s.recv(65536)
            if not b:
                raise AssertionError("keep-alive connection closed; got %r" % buf)
            buf += b

    def close(self):
        self.s.close()


def stats(port):
    cp = curl("http://127.0.0.1:%d/stats" % port)
    return json.loads(cp.stdout)


class ServerCase(unittest.TestCase):
    EXTRA = ()

    def setUp(self):
        self.srv = osrtest.Testd(*self.EXTRA)
        self.port = self.srv.port
        self.tmp = tempfile.mkdtemp(prefix="osr-h1-")

    def tearDown(self):
        rc = self.srv.stop()
        err = self.srv.proc.stderr_text()
        self.assertIn(rc, (0, -signal.SIGTERM), "osr-testd exited %s:\n%s" % (rc, err[-4000:]))
        self.assertNotIn("ERROR: AddressSanitizer", err)
        self.assertNotIn("runtime error:", err)

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)


# ---------------------------------------------------------------------------
# body flow control: hold/release edge cases (osr-testd /hold-sync, /hold-later)


class HoldRelease(ServerCase):
    EXTRA = ("--max-body", "33554432")

    def post(self, path, data, chunked):
        f = os.path.join(self.tmp, "body")
        with open(f, "wb") as fh:
            fh.write(data)
        args = ["-sS", "--max-time", "30", "--data-binary", "@" + f, "-H", "Content-Type: application/octet-stream"]
        if chunked:
            args += ["-H", "Transfer-Encoding: chunked"]
        cp = curl(*(args + [self.url(path)]))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        return json.loads(cp.stdout)

    def test_release_inside_the_callback_keeps_reading(self):
        # hold + release within one on_body call once stopped the socket for good.
        data = osrtest.pattern(3 * 1024 * 1024 + 7)
        for chunked in (False, True):
            self.assertEqual(self.post("/hold-sync", data, chunked)["bytes"], len(data))

    def test_release_of_the_final_chunk_ends_the_body(self):
        # A released final chunk with nothing left to parse once never ended the body.
        for n in (1, 5000, 1024 * 1024 + 3):
            data = osrtest.pattern(n)
            for chunked in (False, True):
                self.assertEqual(self.post("/hold-later", data, chunked)["bytes"], n)


# ---------------------------------------------------------------------------
# curl


class Curl(ServerCase):
    EXTRA = ("--max-body", "33554432")

    def test_hello(self):
        cp = curl("-i", self.url("/hello"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertTrue(cp.stdout.startswith(b"HTTP/1.1 200"), cp.stdout)
        self.assertTrue(cp.stdout.endswith(b"\r\n\r\nhello world\n"), cp.stdout)
        self.assertIn(b"content-length: 12\r\n", cp.stdout.lower())

    def test_keepalive_reuse(self):
        cp = curl("-v", self.url("/hello"), self.url("/bytes?n=1000"), self.url("/hello"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        err = cp.stderr.decode()
        self.assertEqual(err.count("Re-using existing connection"), 2, err)
        self.assertEqual(cp.stdout, b"hello world\n" + osrtest.pattern(1000) + b"hello world\n")

    def test_post_echo_chunked_10mb(self):
        data = os.urandom(10 * 1024 * 1024)
        path = os.path.join(self.tmp, "up")
        with open(path, "wb") as f:
            f.write(data)
        cp = curl("-H", "Transfer-Encoding: chunked", "-H", "Content-Type: application/x-test",
                  "--data-binary", "@" + path, "-D", os.path.join(self.tmp, "h"), self.url("/echo"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(len(cp.stdout), len(data))
        self.assertEqual(hashlib.sha256(cp.stdout).hexdigest(), hashlib.sha256(data).hexdigest())
        with open(os.path.join(self.tmp, "h"), "rb") as f:
            head = f.read().lower()
        self.assertIn(b"transfer-encoding: chunked", head)

    def test_post_echo_content_length(self):
        data = os.urandom(3 * 1024 * 1024 + 17)
        path = os.path.join(self.tmp, "up")
        with open(path, "wb") as f:
            f.write(data)
        cp = curl("--data-binary", "@" + path, self.url("/echo"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(hashlib.sha256(cp.stdout).hexdigest(), hashlib.sha256(data).hexdigest())

    def test_bytes_large(self):
        n = 20 * 1024 * 1024 + 3
        cp = curl(self.url("/bytes?n=%d&seed=5" % n))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(len(cp.stdout), n)
        self.assertEqual(hashlib.sha256(cp.stdout).hexdigest(),
                         hashlib.sha256(osrtest.pattern(n, 5)).hexdigest())

    def test_stream_chunked(self):
        cp = curl("-D", "-", self.url("/stream?chunks=50&size=1000&seed=2"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        head, _, body = cp.stdout.partition(b"\r\n\r\n")
        self.assertIn(b"transfer-encoding: chunked", head.lower())
        self.assertEqual(len(body), 50000)

    def test_head(self):
        cp = curl("-I", self.url("/bytes?n=5000"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertIn(b"content-length: 5000", cp.stdout.lower())
        # Raw: a HEAD answer has no body, so the next response follows at once.
        out = osrtest.raw_exchange(self.port, b"HEAD /bytes?n=5000 HTTP/1.1\r\nHost: t\r\n\r\n"
                                   b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        first, _, rest = out.partition(b"\r\n\r\n")
        self.assertTrue(first.startswith(b"HTTP/1.1 200"), out)
        self.assertTrue(rest.startswith(b"HTTP/1.1 200"), out)
        self.assertTrue(rest.endswith(b"hello world\n"), out)

    def test_expect_100_continue(self):
        data = os.urandom(2 * 1024 * 1024)
        path = os.path.join(self.tmp, "up")
        with open(path, "wb") as f:
            f.write(data)
        cp = curl("-v", "-H", "Expect: 100-continue", "--expect100-timeout", "30",
                  "--data-binary", "@" + path, self.url("/sink"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertIn("HTTP/1.1 100 Continue", cp.stderr.decode())
        j = json.loads(cp.stdout)
        self.assertEqual(j["bytes"], len(data))
        self.assertEqual(j["sha256"], hashlib.sha256(data).hexdigest())

    def test_expect_100_refused_by_size(self):
        # Too large up front: 413, and no 100 Continue is sent.
        out, _ = send_and_read(self.port, [b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 40000000\r\n"
                                           b"Expect: 100-continue\r\n\r\n"], timeout=5)
        self.assertEqual(status_of(out), 413, out)
        self.assertNotIn(b"100 Continue", out)

    def test_http10(self):
        cp = curl("-0", "-i", self.url("/hello"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertIn(b"connection: close", cp.stdout.lower())
        self.assertTrue(cp.stdout.endswith(b"hello world\n"))
        # HTTP/1.0 keep-alive on request.
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        buf = b""
        while not responses(buf):
            buf += s.recv(4096)
        self.assertIn(b"connection: keep-alive", buf.lower())
        s.sendall(b"GET /hello HTTP/1.0\r\n\r\n")
        rest = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            rest += b
        s.close()
        self.assertTrue(rest.startswith(b"HTTP/1.1 200"), rest)
        self.assertTrue(rest.endswith(b"hello world\n"), rest)
        # A streamed answer to HTTP/1.0 cannot be chunked: it ends with the
        # connection.
        out = osrtest.raw_exchange(self.port, b"GET /stream?chunks=3&size=10 HTTP/1.0\r\n\r\n")
        head, _, body = out.partition(b"\r\n\r\n")
        self.assertNotIn(b"chunked", head.lower())
        self.assertEqual(len(body), 30, out)

    def test_headers_lowercase(self):
        cp = curl("-H", "X-Mixed-Case: Value  ", self.url("/headers?a=1"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        j = json.loads(cp.stdout)
        self.assertEqual(j["method"], "GET")
        self.assertEqual(j["target"], "/headers?a=1")
        hdrs = j["headers"]
        self.assertIn("x-mixed-case", hdrs)
        self.assertEqual(hdrs["x-mixed-case"] if isinstance(hdrs["x-mixed-case"], str)
                         else hdrs["x-mixed-case"][0], "Value")


# ---------------------------------------------------------------------------
# pipelining and connection handling over raw sockets


class Pipelining(ServerCase):

    def test_pipelined_in_order(self):
        reqs = [b"GET /bytes?n=%d&seed=%d HTTP/1.1\r\nHost: t\r\n\r\n" % (100 + i, i) for i in range(20)]
        reqs.append(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        reqs.append(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        reqs.append(b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        out = osrtest.raw_exchange(self.port, b"".join(reqs), timeout=10)
        rs = [r[2] for r in responses(out)]
        self.assertEqual(len(rs), 23)
        for i in range(20):
            self.assertEqual(rs[i], osrtest.pattern(100 + i, i))
        self.assertEqual(rs[20], b"hello")
        self.assertEqual(rs[21], b"abc")
        self.assertEqual(rs[22], b"hello world\n")

    def test_pipelined_half_close(self):
        # The client sends everything and shuts down its side: every request
        # is still answered, then the server closes.
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n" * 5)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
        s.close()
        rs = responses(out)
        self.assertEqual([r[0] for r in rs], [200] * 5)
        self.assertTrue(all(r[2] == b"hello world\n" for r in rs))

    def test_pipeline_backpressure(self):
        # Many pipelined requests for large answers: the server must not read
        # them all into memory while it answers the first ones. We send a lot
        # without reading, then read everything and check order and count.
        n = 200
        req = b"GET /bytes?n=65536 HTTP/1.1\r\nHost: t\r\n\r\n"
        s = socket.create_connection(("127.0.0.1", self.port), timeout=20)
        s.setblocking(True)
        sent = threading.Thread(target=lambda: s.sendall(req * n), daemon=True)
        sent.start()
        time.sleep(0.5)
        got = b""
        count = 0
        deadline = time.time() + 60
        while count < n and time.time() < deadline:
            b = s.recv(1 << 20)
            if not b:
                break
            got += b
            rs = responses(got)
            count = len(rs)
        sent.join(10)
        s.close()
        self.assertEqual(count, n)
        self.assertTrue(all(r[2] == osrtest.pattern(65536) for r in responses(got)))

    def test_truncated_request_then_close(self):
        keep = KeepConn(self.port)
        for data in (b"GET /hello HTTP/1.1\r\nHo", b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nabc",
                     b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            out = b""
            while True:
                try:
                    b = s.recv(65536)
                except ConnectionResetError:
                    break
                if not b:
                    break
                out += b
            s.close()
            # /echo answers right away (its head goes out with the first
            # chunk); nothing else may be answered for a truncated request.
            if not data.startswith(b"POST /echo"):
                self.assertEqual(out, b"", data)
        self.assertEqual(keep.get()[0], 200)
        keep.close()

    def test_peer_reset_mid_body(self):
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 300000)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()  # RST
        time.sleep(0.3)
        st = stats(self.port)
        self.assertLessEqual(st["conns"], 1, st)  # only the /stats request itself


# ---------------------------------------------------------------------------
# malformed and malicious requests


class Abuse(ServerCase):
    EXTRA = ("--max-body", "100000", "--max-url", "2048", "--max-headers", "50",
             "--max-header-bytes", "16384")

    def check(self, data, want, name=None):
        keep = KeepConn(self.port)
        out, closed = send_and_read(self.port, [data] if isinstance(data, bytes) else data, timeout=8)
        self.assertEqual(status_of(out), want, "%s: %r" % (name or data[:60], out[:300]))
        self.assertIn(b"connection: close", out.lower())
        self.assertIsNotNone(closed, "connection not closed after %d" % want)
        # A parallel good connection still works.
        st, _, body = keep.get()
        self.assertEqual((st, body), (200, b"hello world\n"))
        keep.close()

    def test_url_too_long(self):
        self.check(b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414)

    def test_header_count(self):
        self.check(b"GET / HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(60)) + b"\r\n", 431)

    def test_header_bytes(self):
        self.check(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431)

    def test_header_flood_endless(self):
        # An endless header line: cut at the cap, not buffered.
        chunks = [b"GET / HTTP/1.1\r\nHost: t\r\nX-Flood: "] + [b"b" * 65536] * 160
        self.check(chunks, 431)

    def test_body_too_large_content_length(self):
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 100001\r\n\r\n", 413)

    def test_body_too_large_chunked(self):
        chunks = [b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"]
        chunks += [b"4000\r\n" + b"z" * 0x4000 + b"\r\n"] * 10
        self.check(chunks, 413)

    def test_invalid_chunk_size(self):
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400)
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"fffffffffffffffffff\r\n", 400, "chunk size overflow")
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", 400)

    def test_smuggling_cl_te(self):
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"0\r\n\r\nGET /hello HTTP/1.1\r\nHost: t\r\n\r\n", 400)
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n"
                   b"0\r\n\r\nGET /hello HTTP/1.1\r\nHost: t\r\n\r\n", 400)

    def test_smuggling_duplicate_content_length(self):
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 8\r\n\r\nabcdefgh", 400)
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 3, 3\r\n\r\nabc", 400)
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: +3\r\n\r\nabc", 400)

    def test_smuggling_te_variants(self):
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400)
        self.check(b"POST /sink HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400)
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\nabc", 501)
        self.check(b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501)

    def test_bare_lf(self):
        self.check(b"GET /hello HTTP/1.1\nHost: t\n\n", 400)
        self.check(b"GET /hello HTTP/1.1\r\nHost: t\nX: y\r\n\r\n", 400)

    def test_obs_fold(self):
        self.check(b"GET /hello HTTP/1.1\r\nHost: t\r\nX-A: b\r\n c\r\n\r\n", 400)
        # The fold straddling two TCP segments.
        self.check([b"GET /hello HTTP/1.1\r\nHost: t\r\nX-A: b\r\n", b"\tc\r\n\r\n"], 400, "split fold")

    def test_space_before_colon(self):
        self.check(b"GET /hello HTTP/1.1\r\nHost : t\r\n\r\n", 400)
        self.check(b"GET /hello HTTP/1.1\r\nHost: t\r\nTransfer-Encoding : chunked\r\n\r\n", 400)

    def test_bad_version(self):
        self.check(b"GET /hello HTTP/2.0\r\nHost: t\r\n\r\n", 505)
        self.check(b"GET /hello HTTP/1.2\r\nHost: t\r\n\r\n", 505)
        self.check(b"GET /hello HTTP/9.9\r\nHost: t\r\n\r\n", 505)

    def test_host_rules(self):
        self.check(b"GET /hello HTTP/1.1\r\n\r\n", 400, "no host")
        self.check(b"GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "two hosts")

    def test_garbage(self):
        self.check(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64) + b"\r\n\r\n", 400)
        self.check(b"GET /a b HTTP/1.1\r\nHost: t\r\n\r\n", 400)
        self.check(b"G\x00T / HTTP/1.1\r\nHost: t\r\n\r\n", 400)

    def test_rss_bounded(self):
        # Warm up, then hammer with floods and oversized bodies; the server
        # must not keep what it refused.
        keep = KeepConn(self.port)
        for _ in range(3):
            send_and_read(self.port, [b"GET / HTTP/1.1\r\nHost: t\r\nX: "] + [b"c" * 65536] * 32, timeout=5)
        before = stats(self.port)["rss_kib"]
        for _ in range(10):
            send_and_read(self.port, [b"GET / HTTP/1.1\r\nHost: t\r\nX: "] + [b"c" * 65536] * 160, timeout=5)
            send_and_read(self.port, [b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"]
                          + [b"10000\r\n" + b"q" * 0x10000 + b"\r\n"] * 40, timeout=5)
            send_and_read(self.port, [b"GET /" + b"u" * 1024] * 200, timeout=5)
        after = stats(self.port)
        self.assertEqual(keep.get()[0], 200)
        keep.close()
        # 10 x (10 MiB header flood + 2.5 MiB body + 200 KiB URL) were sent;
        # an unbounded buffer would show as tens of MiB.
        self.assertLess(after["rss_kib"] - before, 48 * 1024, (before, after))


class Slowloris(ServerCase):
    EXTRA = ("--header-timeout-ms", "1000", "--idle-timeout-ms", "30000")

    def test_dribbled_headers(self):
        keep = KeepConn(self.port)
        chunks = [b"GET /hello HTTP/1.1\r\n"] + [b"X-%d: y\r\n" % i for i in range(100)]
        out, closed = send_and_read(self.port, chunks, delay=0.2, timeout=15)
        self.assertIsNotNone(closed, "server never closed the slow connection")
        # 408 (or a plain close) once header_timeout_ms passed: far sooner
        # than the 20 s the dribble would take, and the idle timer (30 s,
        # reset by every byte) would never fire.
        self.assertLess(closed, 8.0)
        self.assertGreaterEqual(closed, 0.9)
        self.assertIn(status_of(out), (408, None), out)
        self.assertEqual(keep.get()[0], 200)
        keep.close()

    def test_slow_but_within_timeout_is_fine(self):
        chunks = [b"GET /hello HTTP/1.1\r\n", b"Host: t\r\n", b"Connection: close\r\n", b"\r\n"]
        out, _ = send_and_read(self.port, chunks, delay=0.1, timeout=10)
        self.assertEqual(status_of(out), 200, out)

    def test_idle_keepalive_then_request(self):
        # Idle between requests is governed by idle_timeout_ms, not the
        # header timeout.
        keep = KeepConn(self.port)
        self.assertEqual(keep.get()[0], 200)
        time.sleep(1.5)
        self.assertEqual(keep.get()[0], 200)
        keep.close()

    def test_parked_connection_wakes_up_whole(self):
        # A keep-alive connection idle for more than 0.5 s is parked (its
        # HTTP/1.1 state freed, the socket alone waits): the next request
        # on it gets a fresh connection state with the same peer, and
        # pipelined requests, a body and another spell of idleness work as
        # before. Two connections at once, parked and woken in turn.
        a, b = KeepConn(self.port), KeepConn(self.port)

        def headers(k):
            st, hdrs, body = k.get("/headers?x=1")
            self.assertEqual(st, 200)
            return json.loads(body)

        ja = headers(a)
        self.assertEqual(ja["peer"], "127.0.0.1:%d" % a.s.getsockname()[1])
        jb = headers(b)
        for i in range(3):
            time.sleep(0.8)
            for k, j0 in ((a, ja), (b, jb)):
                j = headers(k)
                self.assertEqual(j["peer"], j0["peer"])
                self.assertEqual(j["target"], "/headers?x=1")
                self.assertEqual(j["headers"], {"host": "t"})
        time.sleep(0.8)
        # Pipelined right after the wake-up: both answered, in order.
        a.s.sendall(b"GET /bytes?n=3 HTTP/1.1\r\nHost: t\r\n\r\n"
                    b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        buf = b""
        while len(responses(buf)) < 2:
            d = a.s.recv(65536)
            self.assertTrue(d, buf)
            buf += d
        r = responses(buf)
        self.assertEqual([x[0] for x in r], [200, 200])
        self.assertEqual(r[1][2], b"hello")
        time.sleep(0.8)
        b.s.sendall(b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        buf = b""
        while True:
            d = b.s.recv(65536)
            if not d:
                break
            buf += d
        self.assertEqual(status_of(buf), 200)
        a.close()
        b.close()


class IdleTimeout(ServerCase):
    EXTRA = ("--idle-timeout-ms", "700")

    def test_idle_connection_closed(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
        start = time.time()
        out = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            out += b
        s.close()
        self.assertEqual(status_of(out), 200)
        self.assertLess(time.time() - start, 10)


class Drain(ServerCase):

    def test_sigterm_finishes_inflight(self):
        # A slow streamed response in flight plus an idle keep-alive
        # connection: SIGTERM closes the idle one at once, finishes the
        # stream, then the server exits 0.
        idle = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        idle.sendall(b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
        buf = b""
        while not responses(buf):
            buf += idle.recv(4096)
        p = subprocess.Popen(["curl", "-sS", "--max-time", "30", "-D", "-",
                              self.url("/stream?chunks=10&size=100&delay=200")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(0.6)
        self.srv.proc.p.send_signal(signal.SIGTERM)
        self.assertEqual(idle.recv(4096), b"")  # closed by the drain
        idle.close()
        out, err = p.communicate(timeout=40)
        self.assertEqual(p.returncode, 0, err)
        head, _, body = out.partition(b"\r\n\r\n")
        # The head went out before the drain began, so only the body and
        # the clean end of the chunked stream tell the story.
        self.assertIn(b"transfer-encoding: chunked", head.lower())
        self.assertEqual(len(body), 1000)
        self.assertEqual(self.srv.proc.p.wait(20), 0)


class H2cPriorKnowledge(ServerCase):

    def test_curl_prior_knowledge(self):
        cp = curl("--http2-prior-knowledge", "-sS", "-w", "\n%{http_version}", self.url("/hello"))
        self.assertEqual(cp.returncode, 0, cp.stderr)
        body, _, ver = cp.stdout.rpartition(b"\n")
        self.assertEqual(body, b"hello world\n")
        self.assertEqual(ver, b"2")

    def test_partial_preface_is_not_http1(self):
        # A preface split over several segments is still recognised and is
        # never answered as a malformed HTTP/1.1 request.
        pre = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        out, _ = send_and_read(self.port, [pre[:3], pre[3:10], pre[10:]], delay=0.1, timeout=3)
        self.assertFalse(out.startswith(b"HTTP/1.1"), out)

    def test_http1_after_sniff(self):
        # Requests that only begin like the preface are HTTP/1.1.
        out = osrtest.raw_exchange(self.port, b"PUT /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
                                   b"Connection: close\r\n\r\nok")
        self.assertEqual(status_of(out), 200, out)
        self.assertTrue(out.endswith(b"ok"))


class Tls(unittest.TestCase):
    """HTTP/1.1 over TLS (ALPN http/1.1) with curl."""

    def setUp(self):
        self.certs = osrtest.Certs()
        self.srv = osrtest.Testd(tls=self.certs)

    def tearDown(self):
        rc = self.srv.stop()
        self.certs.cleanup()
        self.assertIn(rc, (0, -signal.SIGTERM), self.srv.proc.stderr_text()[-3000:])

    def test_https_http11(self):
        url = "https://localhost:%d" % self.srv.port
        cp = curl("--http1.1", "--cacert", self.certs.ca, "--resolve", "localhost:%d:127.0.0.1" % self.srv.port,
                  "-v", url + "/hello", url + "/headers")
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertTrue(cp.stdout.startswith(b"hello world\n"), cp.stdout)
        j = json.loads(cp.stdout[len(b"hello world\n"):])
        self.assertEqual(j["version"] if "version" in j else 11, 11)
        self.assertIn("Re-using existing connection", cp.stderr.decode())
        # A parked keep-alive connection (idle > 0.5 s) wakes up over TLS too.
        cp = curl("--http1.1", "--cacert", self.certs.ca, "--resolve", "localhost:%d:127.0.0.1" % self.srv.port,
                  "-v", "--rate", "1/s", url + "/hello", url + "/hello", url + "/hello")
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(cp.stdout, b"hello world\n" * 3)
        self.assertIn("Re-using existing connection", cp.stderr.decode())
        data = os.urandom(1024 * 1024)
        cp = osrtest.sh(["curl", "-sS", "--http1.1", "--cacert", self.certs.ca, "--resolve",
                         "localhost:%d:127.0.0.1" % self.srv.port, "-H", "Transfer-Encoding: chunked",
                         "--data-binary", "@-", url + "/echo"], input=data)
        self.assertEqual(hashlib.sha256(cp.stdout).hexdigest(), hashlib.sha256(data).hexdigest())


# ---------------------------------------------------------------------------
# our client against node's http module and a scripted raw server

NODE_SERVER = r"""
const http = require('http');
const crypto = require('crypto');
const srv = http.createServer((req, res) => {
  const u = new URL(req.url, 'http://x');
  const info = {port: req.socket.remotePort, te: req.headers['transfer-encoding'] || null,
                cl: req.headers['content-length'] || null, host: req.headers['host'] || null,
                method: req.method, x: req.headers['x-test'] || null};
  if (u.pathname === '/hello') { res.setHeader('content-length', 12); res.end('hello world\n'); return; }
  if (u.pathname === '/chunked') {
    res.write('abc');
    setTimeout(() => { res.write('defgh'); setTimeout(() => res.end('ij'), 10); }, 10);
    return;
  }
  if (u.pathname === '/big') {
    const n = +u.searchParams.get('n'); const b = Buffer.alloc(n);
    for (let i = 0; i < n; i++) b[i] = (i * 7 + 3) & 255;
    res.setHeader('content-length', n); res.end(b); return;
  }
  if (u.pathname === '/info') { res.end(JSON.stringify(info) + '\n'); return; }
  if (u.pathname === '/sink') {
    const h = crypto.createHash('sha256'); let n = 0;
    req.on('data', d => { n += d.length; h.update(d); });
    req.on('end', () => { info.bytes = n; info.sha256 = h.digest('hex'); res.end(JSON.stringify(info) + '\n'); });
    return;
  }
  if (u.pathname === '/nocontent') { res.statusCode = 204; res.end(); return; }
  res.statusCode = 404; res.end('nope');
});
srv.keepAliveTimeout = 10000;
srv.listen(0, '127.0.0.1', () => console.log('port ' + srv.address().port));
"""


def testc(*args, timeout=60):
    cp = osrtest.sh([TESTC] + [str(a) for a in args], timeout=timeout, check=False)
    lines = cp.stdout.decode("utf-8", "replace").splitlines()
    return cp, lines


def field(lines, key):
    return [ln[len(key) + 1:] for ln in lines if ln.startswith(key + " ")]


class Client(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="osr-h1c-")
        js = os.path.join(cls.tmp, "srv.js")
        with open(js, "w") as f:
            f.write(NODE_SERVER)
        cls.node = osrtest.Proc(["node", js])
        cls.port = int(cls.node.wait_line("port ").split()[1])
        cls.addr = "127.0.0.1:%d" % cls.port

    @classmethod
    def tearDownClass(cls):
        cls.node.stop()

    def test_get(self):
        cp, lines = testc(self.addr, "/hello")
        self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
        self.assertEqual(field(lines, "version"), ["11"])
        self.assertEqual(field(lines, "status"), ["200"])
        self.assertIn("content-length: 12", field(lines, "header"))
        self.assertEqual(field(lines, "body-sha256"), [hashlib.sha256(b"hello world\n").hexdigest()])

    def test_chunked_response(self):
        cp, lines = testc(self.addr, "/chunked")
        self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
        self.assertIn("transfer-encoding: chunked", field(lines, "header"))
        self.assertEqual(field(lines, "body-bytes"), ["10"])
        self.assertEqual(field(lines, "body-sha256"), [hashlib.sha256(b"abcdefghij").hexdigest()])

    def test_no_content_and_head(self):
        cp, lines = testc(self.addr, "/nocontent")
        self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
        self.assertEqual(field(lines, "status"), ["204"])
        self.assertEqual(field(lines, "body-bytes"), ["0"])
        cp, lines = testc("--method", "HEAD", "--repeat", "2", self.addr, "/big?n=1000")
        self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
        self.assertEqual(field(lines, "body-bytes"), ["0", "0"])
        self.assertIn("content-length: 1000", field(lines, "header"))

    def post(self, *extra):
        data = os.urandom(3 * 1024 * 1024 + 11)
        path = os.path.join(self.tmp, "up")
        with open(path, "wb") as f:
            f.write(data)
        out = os.path.join(self.tmp, "out")
        cp, lines = testc(*extra, "--data-file", path, "--header", "X-Test: yes", "--out", out,
                          self.addr, "/sink")
        self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
        with open(out) as f:
            j = json.loads(f.read())
        self.assertEqual(j["bytes"], len(data))
        self.assertEqual(j["sha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(j["x"], "yes")
        self.assertEqual(j["host"], self.addr)
        return j

    def test_post_content_length(self):
        j = self.post()
        self.assertEqual(j["te"], None)
        self.assertEqual(j["cl"], str(3 * 1024 * 1024 + 11))

    def test_post_chunked(self):
        j = self.post("--chunked")
        self.assertEqual(j["te"], "chunked")
        self.assertEqual(j["cl"], None)

    def test_keepalive_repeat(self):
        out = os.path.join(self.tmp, "ka")
        cp, lines = testc("--repeat", "5", "--out", out, self.addr, "/info")
        self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
        self.assertEqual(field(lines, "status"), ["200"] * 5)
        with open(out) as f:
            infos = [json.loads(ln) for ln in f.read().splitlines()]
        self.assertEqual(len(infos), 5)
        # One connection: node saw the same client port every time.
        self.assertEqual(len({i["port"] for i in infos}), 1, infos)

    def test_keepalive_repeat_with_bodies(self):
        data = b"x" * 100000
        path = os.path.join(self.tmp, "small")
        with open(path, "wb") as f:
            f.write(data)
        out = os.path.join(self.tmp, "ka2")
        cp, lines = testc("--repeat", "4", "--chunked", "--data-file", path, "--out", out, self.addr, "/sink")
        self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
        with open(out) as f:
            infos = [json.loads(ln) for ln in f.read().splitlines()]
        self.assertEqual([i["bytes"] for i in infos], [100000] * 4)
        self.assertEqual(len({i["port"] for i in infos}), 1, infos)

    def test_large_body_hash(self):
        n = 16 * 1024 * 1024 + 5
        want = hashlib.sha256(bytes((i * 7 + 3) & 255 for i in range(n))).hexdigest()
        cp, lines = testc(self.addr, "/big?n=%d" % n)
        self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
        self.assertEqual(field(lines, "body-bytes"), [str(n)])
        self.assertEqual(field(lines, "body-sha256"), [want])

    def test_our_client_our_server(self):
        srv = osrtest.Testd()
        try:
            addr = "127.0.0.1:%d" % srv.port
            cp, lines = testc("--repeat", "3", addr, "/bytes?n=1000000&seed=9")
            self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
            self.assertEqual(field(lines, "body-sha256"),
                             [hashlib.sha256(osrtest.pattern(1000000, 9)).hexdigest()] * 3)
        finally:
            srv.stop()


class ScriptedServer:
    """A one-shot raw TCP server: answers each connection with `script`
    (a function of the received request bytes) and closes."""

    def __init__(self, script):
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(8)
        self.port = self.ls.getsockname()[1]
        self.script = script
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        self.ls.settimeout(20)
        try:
            c, _ = self.ls.accept()
        except OSError:
            return
        c.settimeout(10)
        req = b""
        while b"\r\n\r\n" not in req:
            b = c.recv(65536)
            if not b:
                break
            req += b
        try:
            self.script(c, req)
        finally:
            c.close()

    def close(self):
        self.ls.close()
        self.t.join(5)


class ClientEdge(unittest.TestCase):

    def run_script(self, script, *args):
        srv = ScriptedServer(script)
        try:
            return testc("--timeout-ms", "10000", *args, "127.0.0.1:%d" % srv.port, "/x")
        finally:
            srv.close()

    def test_100_continue_skipped_and_read_until_close(self):
        def script(c, req):
            c.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                      b"HTTP/1.1 200 OK\r\nX-Y: z\r\n\r\n")
            for i in range(5):
                c.sendall(b"part%d;" % i)
                time.sleep(0.02)
        cp, lines = self.run_script(script)
        self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
        self.assertEqual(field(lines, "status"), ["200"])
        self.assertEqual(field(lines, "body-sha256"),
                         [hashlib.sha256(b"part0;part1;part2;part3;part4;").hexdigest()])

    def test_eof_while_a_chunk_is_held_delivers_the_rest(self):
        # The server sends the whole response and closes at once; the client
        # holds every chunk for a while, so the end of the connection arrives
        # while a chunk is held and bytes are still unread. Both a
        # Content-Length body and a close-delimited one must arrive whole.
        parts = [b"chunk-%d;" % i * 512 for i in range(6)]
        body = b"".join(parts)
        for head in (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body),
                     b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"):
            def script(c, req, head=head):
                c.sendall(head + parts[0])
                time.sleep(0.05)
                c.sendall(b"".join(parts[1:]))
                c.shutdown(socket.SHUT_WR)
            cp, lines = self.run_script(script, "--hold-ms", "150")
            self.assertEqual(cp.returncode, 0, cp.stdout + cp.stderr)
            self.assertEqual(field(lines, "body-sha256"), [hashlib.sha256(body).hexdigest()])

    def test_truncated_body_is_an_error(self):
        def script(c, req):
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-some")
        cp, lines = self.run_script(script)
        self.assertNotEqual(cp.returncode, 0)
        self.assertTrue(field(lines, "error"), lines)

    def test_response_header_flood_is_capped(self):
        def script(c, req):
            try:
                c.sendall(b"HTTP/1.1 200 OK\r\n" + b"X-Flood: " + b"f" * (8 * 1024 * 1024))
            except OSError:
                pass
        cp, lines = self.run_script(script)
        self.assertNotEqual(cp.returncode, 0)
        self.assertTrue(field(lines, "error"), lines)

    def test_bad_response_smuggling(self):
        def script(c, req):
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde")
        cp, lines = self.run_script(script)
        self.assertNotEqual(cp.returncode, 0)


if __name__ == "__main__":
    osrtest.run()
