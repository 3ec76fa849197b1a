"""HTTP/2 server (osr-testd) and client (osr-testc, h2multi) against
independent peers: curl, nghttp, h2load, node's http2 module, and raw frames
written by hand in Python (floods, malformed frames, flow-control abuse).

Each TestCase class is one meson test (see meson.build)."""
import hashlib
import json
import os
import signal
import socket
import ssl
import struct
import tempfile
import time
import unittest

import osrtest

TESTC = osrtest.TESTC
H2MULTI = os.environ.get("OSR_H2MULTI", "")
HERE = os.path.dirname(os.path.abspath(__file__))
PEER_JS = os.path.join(HERE, "h2peer.js")

# ---------------------------------------------------------------------------
# raw HTTP/2 frames (RFC 9113), written by hand

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT, S_INITIAL_WINDOW, S_MAX_FRAME, \
    S_MAX_HEADER_LIST = range(1, 7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
FRAME_SIZE_ERROR, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 6, 8, 9, 11


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", ftype, flags, sid) + payload


def settings(*pairs, ack=False):
    return frame(SETTINGS, ACK if ack else 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def hpack_int(v, prefix, first=0):
    lim = (1 << prefix) - 1
    if v < lim:
        return bytes([first | v])
    out = [first | lim]
    v -= lim
    while v >= 128:
        out.append((v & 127) | 128)
        v >>= 7
    out.append(v)
    return bytes(out)


def hpack_lit(name, value):
    """Literal header field without indexing, new name, no Huffman."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def request_block(path, method=b"GET", authority=b"127.0.0.1", extra=()):
    fields = [(b":method", method), (b":scheme", b"http"), (b":path", path),
              (b":authority", authority)] + list(extra)
    return b"".join(hpack_lit(n, v) for n, v in fields)


def get_frame(sid, path, end_stream=True, extra=()):
    return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), sid,
                 request_block(path, extra=extra))


class RawH2:
    """A hand-written HTTP/2 client connection: sends the preface and our
    SETTINGS, then whatever the test writes; reads frames back."""

    def __init__(self, port, pairs=(), host="127.0.0.1", timeout=10.0, preface=True, rcvbuf=None,
                 tls_ctx=None):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.connect((host, port))
        if tls_ctx is not None:
            s = tls_ctx.wrap_socket(s, server_hostname="localhost")
        self.s = s
        self.buf = b""
        self.closed = False
        if preface:
            self.s.sendall(PREFACE + settings(*pairs))

    def send(self, data):
        self.s.sendall(data)

    def blast(self, chunk, total, timeout=3.0):
        """Send `chunk` repeatedly (up to `total` bytes) without reading;
        stop when the peer stops reading (send timeout) or closes."""
        self.s.settimeout(timeout)
        sent = 0
        try:
            while sent < total:
                self.s.sendall(chunk)
                sent += len(chunk)
        except (socket.timeout, BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass
        return sent

    def read_frame(self, timeout=10.0):
        """Next frame as (type, flags, sid, payload); None once closed or timed out."""
        end = time.time() + timeout
        while True:
            if len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + n:
                    t, fl, sid = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
                    payload = self.buf[9:9 + n]
                    self.buf = self.buf[9 + n:]
                    return t, fl, sid, payload
            left = end - time.time()
            if left <= 0 or self.closed:
                return None
            self.s.settimeout(left)
            try:
                b = self.s.recv(262144)
            except socket.timeout:
                return None
            except (ConnectionResetError, ssl.SSLError, OSError):
                b = b""
            if not b:
                self.closed = True
                continue
            self.buf += b

    def read_until(self, pred, timeout=10.0, limit=200000):
        """Read frames until pred(frame) is true; returns (frame or None, all frames)."""
        seen = []
        end = time.time() + timeout
        for _ in range(limit):
            f = self.read_frame(max(0.0, end - time.time()))
            if f is None:
                return None, seen
            seen.append(f)
            if pred(f):
                return f, seen
        return None, seen

    def goaway(self, timeout=10.0):
        """Read until GOAWAY: (last_stream_id, error_code) or None."""
        f, _ = self.read_until(lambda f: f[0] == GOAWAY, timeout)
        if f is None:
            return None
        return int.from_bytes(f[3][:4], "big") & 0x7FFFFFFF, int.from_bytes(f[3][4:8], "big")

    def wait_closed(self, timeout=10.0):
        end = time.time() + timeout
        while time.time() < end:
            if self.read_frame(max(0.0, end - time.time())) is None:
                return self.closed
        return False

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


def curl(*args, timeout=60):
    return osrtest.sh(["curl", "-sS", "--max-time", str(timeout)] + [str(a) for a in args],
                      timeout=timeout + 10, check=False)


def stats(port):
    cp = curl("--http2-prior-knowledge", "http://127.0.0.1:%d/stats" % port, timeout=10)
    return json.loads(cp.stdout)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def pattern_sha(n, seed=0):
    return sha(osrtest.pattern(n, seed))


def parse_testc(out):
    """osr-testc output lines -> dict (headers as a list)."""
    d = {"headers": []}
    for ln in out.decode("utf-8", "replace").splitlines():
        k, _, v = ln.partition(" ")
        if k == "header":
            d["headers"].append(v)
        else:
            d[k] = v
    return d


def need(cmd):
    if not osrtest.have(cmd):
        raise unittest.SkipTest("%s not installed" % cmd)


def testd_env():
    """Under ASan freed memory sits in a 256 MB quarantine, which would make
    RSS bounds meaningless: keep it small for the server under test."""
    opts = os.environ.get("ASAN_OPTIONS", "")
    return {"ASAN_OPTIONS": (opts + ":" if opts else "") + "quarantine_size_mb=4:thread_local_quarantine_size_kb=64"}


class ServerCase(unittest.TestCase):
    """One osr-testd per class (cleartext: h2c prior knowledge)."""
    extra = ()

    @classmethod
    def setUpClass(cls):
        cls.td = osrtest.Testd(*cls.extra, env=testd_env())
        cls.port = cls.td.port
        cls.base = "http://127.0.0.1:%d" % cls.port

    @classmethod
    def tearDownClass(cls):
        rc = cls.td.stop()
        if rc not in (0, -signal.SIGTERM):
            raise AssertionError("osr-testd exited %s:\n%s" % (rc, cls.td.proc.stderr_text()[-4000:]))

    def assert_alive(self):
        cp = curl("--http2-prior-knowledge", self.base + "/hello", timeout=10)
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(cp.stdout, b"hello world\n")


# ---------------------------------------------------------------------------


class Curl(ServerCase):
    extra = ("--max-body", "100000", "--max-headers", "20", "--max-header-bytes", "8192",
             "--max-url", "1024")

    def test_get_prior_knowledge(self):
        cp = curl("--http2-prior-knowledge", "-w", "\n%{http_version} %{http_code}", self.base + "/hello")
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(cp.stdout, b"hello world\n\n2 200")

    def test_request_seen_by_handler(self):
        cp = curl("--http2-prior-knowledge", "-H", "X-Test: Value 1", self.base + "/headers?a=b")
        self.assertEqual(cp.returncode, 0, cp.stderr)
        j = json.loads(cp.stdout)
        self.assertEqual(j["method"], "GET")
        self.assertEqual(j["target"], "/headers?a=b")
        self.assertEqual(j["version"], 20)
        self.assertEqual(j["headers"].get("x-test"), "Value 1")

    def test_status_and_head(self):
        cp = curl("--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}", self.base + "/status/404")
        self.assertEqual(cp.stdout, b"404")
        cp = curl("--http2-prior-knowledge", "-I", self.base + "/bytes?n=12345")
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertIn(b"content-length: 12345", cp.stdout.lower())

    def test_post_echo(self):
        cp = curl("--http2-prior-knowledge", "--data-binary", "abc" * 1000, self.base + "/echo")
        self.assertEqual(cp.stdout, b"abc" * 1000)

    def test_body_over_limit_is_413(self):
        with tempfile.NamedTemporaryFile() as f:
            f.write(b"x" * 200000)
            f.flush()
            # with content-length: refused before the handler
            cp = curl("--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}",
                      "--data-binary", "@" + f.name, self.base + "/sink")
            self.assertEqual(cp.stdout, b"413", cp.stderr)
            # streamed without content-length: refused when the cap is crossed
            cp = curl("--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}",
                      "-H", "Transfer-Encoding: chunked", "--data-binary", "@" + f.name, self.base + "/sink")
            self.assertIn(cp.stdout, (b"413",), cp.stderr)
        self.assert_alive()

    def test_header_caps(self):
        args = []
        for i in range(30):
            args += ["-H", "x-h%d: v" % i]
        cp = curl("--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}", *args, self.base + "/hello")
        self.assertEqual(cp.stdout, b"431")
        cp = curl("--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}",
                  "-H", "x-big: " + "a" * 9000, self.base + "/hello")
        self.assertEqual(cp.stdout, b"431")
        cp = curl("--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}",
                  self.base + "/hello?" + "q" * 2000)
        self.assertEqual(cp.stdout, b"414")
        self.assert_alive()


class Nghttp(ServerCase):
    def setUp(self):
        need("nghttp")

    def test_verbose_get(self):
        cp = osrtest.sh(["nghttp", "-nv", self.base + "/hello"], timeout=30)
        out = cp.stdout.decode()
        self.assertIn(":status: 200", out)
        self.assertIn("recv DATA frame <length=12, flags=0x01", out)
        self.assertIn("SETTINGS_MAX_CONCURRENT_STREAMS", out)

    def test_concurrent_streams(self):
        cp = osrtest.sh(["nghttp", "-nv", "-m", "50", self.base + "/bytes?n=100000"], timeout=60)
        out = cp.stdout.decode()
        self.assertEqual(out.count(":status: 200"), 50)
        streams = {ln.split("stream_id=")[1].split(")")[0] for ln in out.splitlines()
                   if "recv (stream_id=" in ln and ":status: 200" in ln}
        self.assertEqual(len(streams), 50)

    def test_upload(self):
        data = os.urandom(3 * 1024 * 1024 + 7)
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            cp = osrtest.sh(["nghttp", "-d", f.name, self.base + "/echo"], timeout=60)
            self.assertEqual(sha(cp.stdout), sha(data))
            cp = osrtest.sh(["nghttp", "-d", f.name, self.base + "/sink"], timeout=60)
            j = json.loads(cp.stdout)
            self.assertEqual(j["bytes"], len(data))
            self.assertEqual(j["sha256"], sha(data))

    def test_h2load(self):
        need("h2load")
        cp = osrtest.sh(["h2load", "-n", "2000", "-c", "10", "-m", "10", self.base + "/hello"], timeout=120)
        out = cp.stdout.decode()
        self.assertIn("2000 succeeded, 0 failed, 0 errored", out)
        self.assertIn("status codes: 2000 2xx", out)

    def test_streamed_response(self):
        cp = osrtest.sh(["nghttp", self.base + "/stream?chunks=20&size=1000&delay=5"], timeout=30)
        self.assertEqual(len(cp.stdout), 20000)


class Large(ServerCase):
    def test_download_50mb_byte_exact(self):
        n = 50000000
        cp = curl("--http2-prior-knowledge", self.base + "/bytes?n=%d&seed=3" % n, timeout=120)
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(len(cp.stdout), n)
        self.assertEqual(sha(cp.stdout), pattern_sha(n, 3))

    def test_upload_10mb_echo(self):
        need("nghttp")
        data = os.urandom(10 * 1024 * 1024)
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            cp = osrtest.sh(["nghttp", "-d", f.name, self.base + "/echo"], timeout=120)
            self.assertEqual(len(cp.stdout), len(data))
            self.assertEqual(sha(cp.stdout), sha(data))
            cp = curl("--http2-prior-knowledge", "--data-binary", "@" + f.name, self.base + "/echo", timeout=120)
            self.assertEqual(sha(cp.stdout), sha(data))


class FlowControl(ServerCase):
    extra = ("--h2-window", "65535")

    def test_small_client_window(self):
        need("nghttp")
        n = 20000000
        # 2^16-1 per stream and for the connection: WINDOW_UPDATE after every few frames
        cp = osrtest.sh(["nghttp", "-w", "16", "-W", "16", self.base + "/bytes?n=%d" % n], timeout=120)
        self.assertEqual(sha(cp.stdout), pattern_sha(n))

    def test_small_server_window_upload(self):
        need("nghttp")
        data = os.urandom(4 * 1024 * 1024)
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            cp = osrtest.sh(["nghttp", "-d", f.name, self.base + "/echo"], timeout=120)
            self.assertEqual(sha(cp.stdout), sha(data))

    def test_no_window_update_memory_bounded(self):
        before = stats(self.port)["rss_kib"]
        conns = []
        for _ in range(10):
            c = RawH2(self.port, pairs=[(S_INITIAL_WINDOW, 1024)])
            for k in range(5):
                c.send(get_frame(1 + 2 * k, b"/bytes?n=1000000000"))
            conns.append(c)
        # Each stream gets its 1 KiB; nothing more may be produced or queued.
        c = conns[0]
        got = {}
        end = time.time() + 3
        while time.time() < end:
            f = c.read_frame(0.5)
            if f is None:
                break
            if f[0] == DATA:
                got[f[2]] = got.get(f[2], 0) + len(f[3])
        self.assertEqual(sorted(got.values()), [1024] * 5)
        time.sleep(1)
        after = stats(self.port)["rss_kib"]
        self.assertLess(after - before, 40 * 1024, "rss grew from %d to %d KiB" % (before, after))
        # The stall was flow control: a WINDOW_UPDATE lets exactly that much more through.
        c.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 5000)))
        more = 0
        end = time.time() + 3
        while more < 5000 and time.time() < end:
            f = c.read_frame(1)
            if f is None:
                break
            if f[0] == DATA and f[2] == 1:
                more += len(f[3])
        self.assertEqual(more, 5000)
        for c in conns:
            c.close()
        self.assert_alive()

    def test_peer_not_reading_memory_bounded(self):
        """Huge windows but the client never reads: socket backpressure must
        stop the server from producing (no unbounded output queue)."""
        before = stats(self.port)["rss_kib"]
        conns = []
        for _ in range(5):
            c = RawH2(self.port, pairs=[(S_INITIAL_WINDOW, 0x7FFFFFFF)], rcvbuf=65536)
            c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF - 65535)))
            c.send(get_frame(1, b"/bytes?n=2000000000"))
            conns.append(c)
        time.sleep(3)
        mid = stats(self.port)["rss_kib"]
        time.sleep(2)
        after = stats(self.port)["rss_kib"]
        self.assertLess(after - before, 40 * 1024, "rss %d -> %d -> %d KiB" % (before, mid, after))
        self.assertLess(after - mid, 8 * 1024, "still growing: %d -> %d KiB" % (mid, after))
        for c in conns:
            c.close()
        self.assert_alive()


class Floods(ServerCase):
    def rss(self):
        return stats(self.port)["rss_kib"]

    def test_ping_flood_without_reading(self):
        before = self.rss()
        c = RawH2(self.port, rcvbuf=32768)
        ping = frame(PING, 0, 0, b"12345678") * 4096
        sent = c.blast(ping, 200 * 1024 * 1024, timeout=3)
        self.assertLess(sent, 200 * 1024 * 1024, "the server kept reading a flood it could not answer")
        self.assert_alive()
        after = self.rss()
        self.assertLess(after - before, 40 * 1024, "rss %d -> %d KiB" % (before, after))
        c.close()

    def test_settings_flood(self):
        before = self.rss()
        c = RawH2(self.port, rcvbuf=32768)
        st = settings((S_MAX_CONCURRENT, 100), (S_HEADER_TABLE_SIZE, 4096)) * 2048
        sent = c.blast(st, 200 * 1024 * 1024, timeout=3)
        self.assertLess(sent, 200 * 1024 * 1024)
        self.assert_alive()
        after = self.rss()
        self.assertLess(after - before, 40 * 1024, "rss %d -> %d KiB" % (before, after))
        c.close()

    def test_too_many_settings_entries(self):
        c = RawH2(self.port)
        c.send(settings(*[(S_MAX_CONCURRENT, 100)] * 100))
        ga = c.goaway()
        self.assertIsNotNone(ga)
        self.assertEqual(ga[1], ENHANCE_YOUR_CALM)
        self.assertTrue(c.wait_closed())
        c.close()

    def test_rapid_reset(self):
        c = RawH2(self.port)
        burst = b"".join(get_frame(sid, b"/hello") + frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL))
                         for sid in range(1, 2 * 3000, 2))
        c.blast(burst, len(burst), timeout=5)
        ga = c.goaway(timeout=15)
        self.assertIsNotNone(ga, "no GOAWAY after 3000 immediate resets")
        self.assertNotEqual(ga[1], NO_ERROR)
        self.assertTrue(c.wait_closed())
        c.close()
        self.assert_alive()

    def test_huge_header_list(self):
        # 15 x 4.8 KB fields spread over HEADERS + 4 CONTINUATIONs: over the
        # 64 KiB cap, so the stream is answered (431) and the connection survives.
        block = request_block(b"/hello", extra=[(b"x-f%d" % i, b"v" * 4800) for i in range(15)])
        chunks = [block[i:i + 16000] for i in range(0, len(block), 16000)]
        data = frame(HEADERS, END_STREAM, 1, chunks[0])
        for i, ch in enumerate(chunks[1:]):
            data += frame(CONTINUATION, END_HEADERS if i == len(chunks) - 2 else 0, 1, ch)
        c = RawH2(self.port)
        c.send(data)
        f, _ = c.read_until(lambda f: f[0] in (HEADERS, RST_STREAM, GOAWAY) and f[2] in (0, 1))
        self.assertIsNotNone(f)
        self.assertEqual(f[0], HEADERS, "expected a response, got frame type %d" % f[0])
        c.send(frame(PING, 0, 0, b"stillok!"))
        f, _ = c.read_until(lambda f: f[0] == PING and f[1] & ACK)
        self.assertIsNotNone(f)
        self.assertEqual(f[3], b"stillok!")
        c.close()
        # a single field larger than the HPACK limit is a connection error
        c = RawH2(self.port)
        block = request_block(b"/hello", extra=[(b"x-huge", b"v" * 100000)])
        chunks = [block[i:i + 16000] for i in range(0, len(block), 16000)]
        data = frame(HEADERS, END_STREAM, 1, chunks[0])
        for i, ch in enumerate(chunks[1:]):
            data += frame(CONTINUATION, END_HEADERS if i == len(chunks) - 2 else 0, 1, ch)
        c.blast(data, len(data))
        ga = c.goaway()
        self.assertIsNotNone(ga)
        self.assertNotEqual(ga[1], NO_ERROR)
        c.close()
        self.assert_alive()

    def test_continuation_flood(self):
        c = RawH2(self.port)
        data = frame(HEADERS, 0, 1, request_block(b"/hello"))
        data += b"".join(frame(CONTINUATION, 0, 1, hpack_lit(b"x-c", b"v" * 10)) for _ in range(100000))
        c.blast(data, len(data), timeout=3)
        ga = c.goaway()
        self.assertIsNotNone(ga)
        self.assertNotEqual(ga[1], NO_ERROR)
        self.assertTrue(c.wait_closed())
        c.close()
        self.assert_alive()

    def test_invalid_frames(self):
        cases = [
            ("DATA on stream 0", frame(DATA, 0, 0, b"xx"), PROTOCOL_ERROR),
            ("WINDOW_UPDATE of 0", frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)), PROTOCOL_ERROR),
            ("initial window too large", settings((S_INITIAL_WINDOW, 0x80000000)), FLOW_CONTROL_ERROR),
            ("PING of 9 bytes", frame(PING, 0, 0, b"123456789"), FRAME_SIZE_ERROR),
            ("HEADERS on an even stream", get_frame(2, b"/hello"), PROTOCOL_ERROR),
            ("frame over max size", frame(DATA, 0, 1, b"x" * 20000), FRAME_SIZE_ERROR),
            ("window overflow", frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF)), FLOW_CONTROL_ERROR),
        ]
        for name, data, code in cases:
            with self.subTest(name):
                c = RawH2(self.port)
                c.send(data)
                ga = c.goaway()
                self.assertIsNotNone(ga, name)
                self.assertEqual(ga[1], code, name)
                self.assertTrue(c.wait_closed(), name)
                c.close()
        self.assert_alive()

    def test_garbage_after_preface(self):
        c = RawH2(self.port, preface=False)
        c.send(PREFACE + os.urandom(5000))
        self.assertTrue(c.wait_closed())
        c.close()
        # A broken preface is not HTTP/2 at all: closed (or answered as HTTP/1.1), never served.
        c = RawH2(self.port, preface=False)
        c.send(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + settings())
        self.assertTrue(c.wait_closed())
        self.assertNotIn(bytes([0, 0, 0, SETTINGS]), c.buf[:4])
        c.close()
        self.assert_alive()

    def test_many_connections_abort_midway(self):
        # streams in flight when the connection drops: on_done fires, nothing leaks (ASan)
        for _ in range(20):
            c = RawH2(self.port)
            c.send(get_frame(1, b"/bytes?n=10000000") + get_frame(3, b"/stream?chunks=100&size=100&delay=10")
                   + frame(HEADERS, END_HEADERS, 5, request_block(b"/echo", method=b"POST"))
                   + frame(DATA, 0, 5, b"x" * 1000))
            c.read_frame(1)
            c.close()
        self.assert_alive()


class Drain(unittest.TestCase):
    def test_sigterm_finishes_inflight_streams(self):
        need("nghttp")
        td = osrtest.Testd()
        base = "http://127.0.0.1:%d" % td.port
        p = osrtest.Proc(["nghttp", "-v", base + "/stream?chunks=20&size=1000&delay=100"])
        time.sleep(0.7)
        os.kill(td.proc.p.pid, signal.SIGTERM)
        td.proc.wait_line("drained", timeout=15)
        rc = td.proc.p.wait(30)
        td.stop()
        self.assertEqual(rc, 0, td.proc.stderr_text()[-3000:])
        p.p.wait(20)
        out = "\n".join(p.lines)
        self.assertIn("recv GOAWAY", out)
        self.assertEqual(out.count("recv DATA frame <length=1000"), 20, out[-3000:])
        self.assertIn("; END_STREAM", out)
        p.stop()

    def test_raw_client_sees_notice_then_final_goaway(self):
        td = osrtest.Testd()
        c = RawH2(td.port)
        c.send(get_frame(1, b"/stream?chunks=10&size=10&delay=100"))
        c.read_until(lambda f: f[0] == HEADERS and f[2] == 1)
        os.kill(td.proc.p.pid, signal.SIGTERM)
        # the shutdown notice (GOAWAY with the maximum id) and a PING, in either order
        got = {}

        def notice_and_ping(f):
            if f[0] == GOAWAY:
                got.setdefault("goaway", f)
            if f[0] == PING and not f[1] & ACK:
                got.setdefault("ping", f)
            return len(got) == 2
        f, seen = c.read_until(notice_and_ping)
        self.assertIsNotNone(f, seen)
        self.assertEqual(int.from_bytes(got["goaway"][3][:4], "big"), 0x7FFFFFFF)
        self.assertEqual(int.from_bytes(got["goaway"][3][4:8], "big"), NO_ERROR)
        c.send(frame(PING, ACK, 0, got["ping"][3]))
        f, more2 = c.read_until(lambda f: f[0] == GOAWAY)
        self.assertIsNotNone(f)
        self.assertEqual(int.from_bytes(f[3][:4], "big"), 1)  # final: last stream 1
        rest, more3 = c.read_until(lambda f: f[0] == DATA and f[1] & END_STREAM)
        self.assertIsNotNone(rest, "stream 1 was not finished after GOAWAY")
        self.assertTrue(c.wait_closed())
        c.close()
        td.proc.wait_line("drained", timeout=15)
        rc = td.proc.p.wait(30)
        td.stop()
        self.assertEqual(rc, 0, td.proc.stderr_text()[-3000:])


class IdleTimeout(ServerCase):
    extra = ("--idle-timeout-ms", "500")

    def test_idle_connection_gets_goaway(self):
        c = RawH2(self.port)
        c.send(settings(ack=True))
        t0 = time.time()
        ga = c.goaway(timeout=10)
        self.assertIsNotNone(ga)
        self.assertEqual(ga[1], NO_ERROR)
        self.assertTrue(c.wait_closed())
        self.assertLess(time.time() - t0, 8)
        c.close()

    def test_busy_stream_keeps_connection(self):
        # a response that takes 3 idle periods but keeps sending is not idle
        cp = curl("--http2-prior-knowledge", self.base + "/stream?chunks=15&size=10&delay=100", timeout=30)
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(len(cp.stdout), 150)


class Tls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.certs = osrtest.Certs()
        try:
            cls.td = osrtest.Testd(tls=cls.certs)
        except Exception:
            cls.certs.cleanup()
            raise
        cls.base = "https://localhost:%d" % cls.td.port
        cls.resolve = "localhost:%d:127.0.0.1" % cls.td.port

    @classmethod
    def tearDownClass(cls):
        rc = cls.td.stop()
        cls.certs.cleanup()
        if rc not in (0, -signal.SIGTERM):
            raise AssertionError("osr-testd exited %s:\n%s" % (rc, cls.td.proc.stderr_text()[-4000:]))

    def curl(self, *args, timeout=60):
        return curl("--http2", "--cacert", self.certs.ca, "--resolve", self.resolve, *args, timeout=timeout)

    def test_alpn_h2(self):
        cp = self.curl("-w", "\n%{http_version}", self.base + "/hello")
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(cp.stdout, b"hello world\n\n2")

    def test_large_download_and_upload(self):
        n = 20000000
        cp = self.curl(self.base + "/bytes?n=%d&seed=9" % n, timeout=120)
        self.assertEqual(sha(cp.stdout), pattern_sha(n, 9))
        data = os.urandom(5 * 1024 * 1024)
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            cp = self.curl("--data-binary", "@" + f.name, self.base + "/echo", timeout=120)
            self.assertEqual(sha(cp.stdout), sha(data))

    def test_nghttp_and_h2load(self):
        need("nghttp")
        url = "https://127.0.0.1:%d" % self.td.port
        cp = osrtest.sh(["nghttp", "-nv", "-m", "10", url + "/hello"], timeout=60)
        self.assertEqual(cp.stdout.decode().count(":status: 200"), 10)
        need("h2load")
        cp = osrtest.sh(["h2load", "-n", "1000", "-c", "5", "-m", "10", url + "/hello"], timeout=120)
        self.assertIn("1000 succeeded, 0 failed", cp.stdout.decode())

    def test_bad_preface_over_tls(self):
        ctx = ssl.create_default_context(cafile=self.certs.ca)
        ctx.set_alpn_protocols(["h2"])
        c = RawH2(self.td.port, preface=False, tls_ctx=ctx)
        self.assertEqual(c.s.selected_alpn_protocol(), "h2")
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(c.wait_closed())
        c.close()
        cp = self.curl(self.base + "/hello")
        self.assertEqual(cp.stdout, b"hello world\n")


class NodePeer:
    """node h2peer.js: an independent HTTP/2 server for our client."""

    def __init__(self, *args):
        need("node")
        self.proc = osrtest.Proc(["node", PEER_JS] + list(args))
        self.port = int(self.proc.wait_line("listening ", timeout=15).split()[1])

    def stop(self):
        self.proc.stop()


class Client(unittest.TestCase):
    tls_args = ()
    addr_host = "127.0.0.1"

    @classmethod
    def setUpClass(cls):
        cls.peer = NodePeer()
        cls.addr = "127.0.0.1:%d" % cls.peer.port

    @classmethod
    def tearDownClass(cls):
        cls.peer.stop()

    def run_testc(self, *args, check=True, timeout=120):
        cp = osrtest.sh([TESTC, "--h2"] + list(self.tls_args) + [str(a) for a in args], timeout=timeout,
                        check=check)
        return parse_testc(cp.stdout), cp

    def test_get(self):
        d, _ = self.run_testc("--header", "X-Test: Abc", self.addr, "/headers")
        self.assertEqual(d["version"], "20")
        self.assertEqual(d["status"], "200")
        d, cp = self.run_testc(self.addr, "/hello")
        self.assertEqual(d["body-sha256"], sha(b"hello from node\n"))

    def test_headers_reach_peer(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "h.json")
            self.run_testc("--header", "X-Test: Abc", "--header", "Connection: close", "--out", out,
                       self.addr, "/headers")
            with open(out) as f:
                j = json.load(f)
        self.assertEqual(j["x-test"], "Abc")
        self.assertNotIn("connection", j)
        self.assertEqual(j[":method"], "GET")
        self.assertEqual(j[":path"], "/headers")
        self.assertEqual(j[":scheme"], "https" if self.tls_args else "http")

    def test_large_body_hash(self):
        n = 20000000
        d, _ = self.run_testc(self.addr, "/bytes?n=%d&seed=5" % n)
        self.assertEqual(int(d["body-bytes"]), n)
        self.assertEqual(d["body-sha256"], pattern_sha(n, 5))

    def test_upload(self):
        data = os.urandom(6 * 1024 * 1024 + 1)
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            d, _ = self.run_testc("--data-file", f.name, self.addr, "/echo")
            self.assertEqual(d["body-sha256"], sha(data))
            d, _ = self.run_testc("--chunked", "--data-file", f.name, self.addr, "/echo")
            self.assertEqual(d["body-sha256"], sha(data))

    def test_repeat_on_one_connection(self):
        d, cp = self.run_testc("--repeat", "20", self.addr, "/bytes?n=100000&seed=1")
        self.assertEqual(cp.stdout.decode().count("body-sha256 " + pattern_sha(100000, 1)), 20)

    def test_concurrent_requests(self):
        if not H2MULTI:
            raise unittest.SkipTest("OSR_H2MULTI not set")
        cp = osrtest.sh([H2MULTI] + list(self.tls_args) + [self.addr], timeout=120, check=False)
        out = cp.stdout.decode()
        self.assertEqual(cp.returncode, 0, out + cp.stderr.decode()[-3000:])
        self.assertIn("done 14 failures 0", out)

    def test_stream_reset_by_peer(self):
        d, cp = self.run_testc(self.addr, "/reset", check=False)
        self.assertNotEqual(cp.returncode, 0)
        self.assertIn("error", d)


class ClientTls(Client):
    @classmethod
    def setUpClass(cls):
        cls.certs = osrtest.Certs()
        cls.peer = NodePeer("--tls", cls.certs.cert, cls.certs.key)
        cls.addr = "127.0.0.1:%d" % cls.peer.port
        cls.tls_args = ("--tls", "--ca", cls.certs.ca, "--sni", "localhost")

    @classmethod
    def tearDownClass(cls):
        cls.peer.stop()
        cls.certs.cleanup()


if __name__ == "__main__":
    osrtest.run()
