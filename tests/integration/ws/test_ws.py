"""WebSocket integration tests (RFC 6455).

Server side: osr-testd's /ws echo route driven by the npm `ws` client
(ws_client.js) and by raw Python sockets for what a well-behaved client
never sends (unmasked frames, reserved opcodes and bits, invalid UTF-8, bad
handshakes, a flood that never reads).

Client side: osr-wsc (tests/peers/osr-wsc.c) against an npm `ws`
WebSocketServer (ws_server.js) and against raw Python servers that break the
protocol (masked server frames, wrong Sec-WebSocket-Accept, a subprotocol
that was not offered).

Subprotocol policy (decided here, RFC 6455 4.2.2): when the client offers
none of the server's subprotocols the server still answers 101, without a
Sec-WebSocket-Protocol header. npm ws, like browsers, then fails the
connection on its side ("Server sent no subprotocol"); a client that offered
nothing is unaffected.
"""
import base64
import hashlib
import json
import os
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
from osrtest import Proc, Testd, node_modules, pattern, sh  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WSC = os.environ.get("OSR_WSC", "")
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
NODE_ENV = {"OSR_NODE_MODULES": node_modules()}


def sha(b):
    return hashlib.sha256(b).hexdigest()


def need_node(tc):
    if not os.path.isdir(os.path.join(node_modules(), "ws")):
        tc.fail("npm ws is not installed: run 'npm ci --prefix tests'")


def ws_client(url, plan, timeout=90):
    """Run ws_client.js with a plan; return its events (dicts)."""
    cp = sh(["node", os.path.join(HERE, "ws_client.js"), url, json.dumps(plan)],
            timeout=timeout, env=NODE_ENV)
    evs = [json.loads(ln) for ln in cp.stdout.decode().splitlines() if ln.startswith("{")]
    if any(e["event"] == "timeout" for e in evs):
        raise AssertionError("ws client timed out: %r" % evs[-5:])
    return evs


def events(evs, kind):
    return [e for e in evs if e["event"] == kind]


# ---- raw WebSocket client over a Python socket -------------------------------

def accept_for(key):
    return base64.b64encode(hashlib.sha1(key + GUID).digest())


def frame(op, payload=b"", fin=True, rsv=0, mask=True, key=b"\x01\x02\x03\x04"):
    b0 = (0x80 if fin else 0) | (rsv << 4) | op
    n = len(payload)
    m = 0x80 if mask else 0
    if n < 126:
        hdr = struct.pack("!BB", b0, m | n)
    elif n < 65536:
        hdr = struct.pack("!BBH", b0, m | 126, n)
    else:
        hdr = struct.pack("!BBQ", b0, m | 127, n)
    if not mask:
        return hdr + payload
    body = bytes(c ^ key[i % 4] for i, c in enumerate(payload)) if n < 4096 else \
        _mask_fast(payload, key)
    return hdr + key + body


def _mask_fast(payload, key):
    k = (key * (len(payload) // 4 + 1))[:len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(k, "big")).to_bytes(len(payload), "big")


class RawWs:
    """A hand-driven WebSocket client: handshake, then frames both ways."""

    def __init__(self, port, path="/ws", headers=None, key=None, version=b"13", protocols=None,
                 expect_101=True):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.key = key if key is not None else base64.b64encode(os.urandom(16))
        lines = [b"GET " + path.encode() + b" HTTP/1.1", b"Host: 127.0.0.1",
                 b"Upgrade: websocket", b"Connection: Upgrade"]
        if self.key:
            lines.append(b"Sec-WebSocket-Key: " + self.key)
        if version:
            lines.append(b"Sec-WebSocket-Version: " + version)
        if protocols:
            lines.append(b"Sec-WebSocket-Protocol: " + b", ".join(protocols))
        lines += headers or []
        self.s.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        buf = b""
        while b"\r\n\r\n" not in buf:
            b = self.s.recv(65536)
            if not b:
                break
            buf += b
        self.head, _, self.rest = buf.partition(b"\r\n\r\n")
        self.status = int(self.head.split(b" ", 2)[1]) if self.head else 0
        self.headers = {}
        for ln in self.head.split(b"\r\n")[1:]:
            k, _, v = ln.partition(b":")
            self.headers[k.strip().lower().decode()] = v.strip().decode()
        if expect_101 and self.status != 101:
            raise AssertionError("handshake answered %r" % self.head)

    def send(self, data):
        self.s.sendall(data)

    def _read(self, n):
        while len(self.rest) < n:
            b = self.s.recv(65536)
            if not b:
                raise EOFError
            self.rest += b
        out, self.rest = self.rest[:n], self.rest[n:]
        return out

    def recv_frame(self):
        """(fin, rsv, opcode, payload); server frames must be unmasked."""
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._read(8))[0]
        if b1 & 0x80:
            raise AssertionError("server sent a masked frame")
        return (b0 >> 7, (b0 >> 4) & 7, b0 & 0xF, self._read(n))

    def wait_close(self, timeout=10):
        """Read frames until a close frame; return (code, reason, frames before)."""
        self.s.settimeout(timeout)
        before = []
        while True:
            fin, rsv, op, p = self.recv_frame()
            if op == 8:
                code = struct.unpack("!H", p[:2])[0] if len(p) >= 2 else 1005
                return code, p[2:].decode(), before
            before.append((op, p))

    def eof_after_close(self, timeout=10):
        """After the close handshake the server closes the TCP connection."""
        self.s.settimeout(timeout)
        try:
            while True:
                b = self.s.recv(65536)
                if not b:
                    return True
        except (ConnectionResetError, socket.timeout):
            return False

    def close(self):
        self.s.close()


class WsCase(unittest.TestCase):
    def setUp(self):
        need_node(self)
        self.d = Testd()
        self.url = "ws://127.0.0.1:%d/ws" % self.d.port

    def tearDown(self):
        rc = self.d.stop()
        if rc not in (0, -15):
            self.fail("osr-testd exited with %s:\n%s" % (rc, self.d.proc.stderr_text()[-4000:]))


# ==== npm ws client -> osr-testd ================================================

class Echo(WsCase):
    def test_text_and_binary_byte_exact(self):
        text = "h\u00e9llo w\u00f6rld \u2713 \U0001F600"
        plan = {"protocols": ["echo.v1"], "steps": [
            {"text": text}, {"binary": 1, "seed": 1}, {"binary": 0},
            {"binary": 70000, "seed": 2}, {"text": ""},
            {"wait": 5}, {"close": [1000, "done"]}]}
        evs = ws_client(self.url, plan)
        msgs = events(evs, "message")
        self.assertEqual(len(msgs), 5, evs)
        self.assertEqual(msgs[0]["type"], "text")
        self.assertEqual(msgs[0]["text"], text)
        self.assertEqual([m["type"] for m in msgs], ["text", "binary", "binary", "binary", "text"])
        self.assertEqual(msgs[1]["sha"], sha(pattern(1, 1)))
        self.assertEqual(msgs[2]["len"], 0)
        self.assertEqual(msgs[3]["sha"], sha(pattern(70000, 2)))
        self.assertEqual(events(evs, "close")[0]["code"], 1000)

    def test_8mb_message(self):
        n = 8 * 1024 * 1024
        plan = {"steps": [{"binary": n, "seed": 3}, {"binary": n, "seed": 4}, {"wait": 2},
                          {"close": [1000, ""]}]}
        msgs = events(ws_client(self.url, plan), "message")
        self.assertEqual([(m["len"], m["sha"]) for m in msgs],
                         [(n, sha(pattern(n, 3))), (n, sha(pattern(n, 4)))])

    def test_fragmented_from_ws(self):
        plan = {"steps": [
            {"fragments": ["ab", "cd", "ef"], "binary": False},
            {"fragments": ["x" * 5000, "y" * 70000, "z"], "binary": True},
            {"wait": 2}, {"close": [1000, ""]}]}
        msgs = events(ws_client(self.url, plan), "message")
        self.assertEqual(msgs[0]["type"], "text")
        self.assertEqual(msgs[0]["text"], "abcdef")
        self.assertEqual(msgs[1]["type"], "binary")
        self.assertEqual(msgs[1]["sha"], sha(b"x" * 5000 + b"y" * 70000 + b"z"))

    def test_ping_pong_both_ways(self):
        plan = {"steps": [{"ping": "abc"}, {"text": "ping"}, {"text": "after"}, {"wait": 1},
                          {"close": [1000, ""]}]}
        evs = ws_client(self.url, plan)
        self.assertEqual([e["data"] for e in events(evs, "pong")], ["abc"])
        self.assertEqual([e["data"] for e in events(evs, "ping")], ["osr"])
        self.assertEqual([m["text"] for m in events(evs, "message")], ["after"])


class SendV(WsCase):
    """osr_ws_sendv (frames written by reference, header built by us) against
    npm ws: osr-testd's /wsv echoes binary messages through it (in three
    pieces) and text ones through osr_ws_send, so every length encoding
    (7-bit, 16-bit, 64-bit and their edges) and the order between the two
    send paths are checked byte-exact by an independent peer."""

    SIZES = [0, 1, 2, 124, 125, 126, 127, 1000, 65534, 65535, 65536, 65537, 70000,
             (1 << 20) + 3, 8 << 20]

    def test_frame_sizes_byte_exact(self):
        url = "ws://127.0.0.1:%d/wsv" % self.d.port
        steps = []
        for i, n in enumerate(self.SIZES):
            steps.append({"binary": n, "seed": i + 1})
            steps.append({"text": "after %d" % n})
        steps += [{"wait": 2 * len(self.SIZES)}, {"close": [1000, "done"]}]
        evs = ws_client(url, {"steps": steps})
        msgs = events(evs, "message")
        self.assertEqual(len(msgs), 2 * len(self.SIZES), evs[-5:])
        for i, n in enumerate(self.SIZES):
            b, t = msgs[2 * i], msgs[2 * i + 1]
            self.assertEqual((b["type"], b["len"], b["sha"]), ("binary", n, sha(pattern(n, i + 1))), n)
            self.assertEqual((t["type"], t["text"]), ("text", "after %d" % n))
        self.assertEqual(events(evs, "close")[0]["code"], 1000)

    def test_close_waits_for_queued_frames(self):
        """Messages sent right before the client's close are all echoed
        before the server's close frame (a close never overtakes them)."""
        url = "ws://127.0.0.1:%d/wsv" % self.d.port
        steps = [{"binary": 300000, "seed": i + 1} for i in range(6)] + [{"close": [1000, "bye"]}]
        evs = ws_client(url, {"steps": steps})
        msgs = events(evs, "message")
        self.assertEqual([(m["len"], m["sha"]) for m in msgs],
                         [(300000, sha(pattern(300000, i + 1))) for i in range(6)])
        self.assertEqual(events(evs, "close")[0]["code"], 1000)


class Subprotocol(WsCase):
    def test_server_preference(self):
        evs = ws_client(self.url, {"protocols": ["chat.v2", "echo.v1"], "steps": [{"close": [1000, ""]}]})
        self.assertEqual(events(evs, "open")[0]["protocol"], "echo.v1")

    def test_single_offer(self):
        evs = ws_client(self.url, {"protocols": ["chat.v2"], "steps": [{"close": [1000, ""]}]})
        self.assertEqual(events(evs, "open")[0]["protocol"], "chat.v2")

    def test_no_protocol_offered(self):
        evs = ws_client(self.url, {"steps": [{"text": "x"}, {"wait": 1}, {"close": [1000, ""]}]})
        self.assertEqual(events(evs, "open")[0]["protocol"], "")
        self.assertEqual(len(events(evs, "message")), 1)

    def test_no_common_protocol(self):
        # Our side: 101 without Sec-WebSocket-Protocol.
        r = RawWs(self.d.port, protocols=[b"nope.v9"])
        self.assertNotIn("sec-websocket-protocol", r.headers)
        self.assertEqual(r.headers["sec-websocket-accept"], accept_for(r.key).decode())
        r.close()
        # npm ws then refuses on its side.
        evs = ws_client(self.url, {"protocols": ["nope.v9"], "steps": []})
        self.assertEqual(events(evs, "open"), [])
        self.assertIn("no subprotocol", events(evs, "error")[0]["message"])


class Close(WsCase):
    def test_client_closes_4001(self):
        evs = ws_client(self.url, {"steps": [{"close": [4001, "bye"]}]})
        c = events(evs, "close")[0]
        self.assertEqual((c["code"], c["reason"]), (4001, "bye"))

    def test_server_closes_4002(self):
        evs = ws_client(self.url, {"steps": [{"text": "close:4002"}]})
        c = events(evs, "close")[0]
        self.assertEqual((c["code"], c["reason"]), (4002, "requested"))

    def test_raw_close_handshake_and_tcp_close(self):
        r = RawWs(self.d.port)
        r.send(frame(1, b"hi") + frame(8, struct.pack("!H", 4003) + b"raw"))
        code, reason, before = r.wait_close()
        self.assertEqual(before, [(1, b"hi")])
        self.assertEqual((code, reason), (4003, "raw"))
        self.assertTrue(r.eof_after_close(), "server did not close TCP after the close handshake")
        r.close()


class Limits(WsCase):
    def test_message_over_cap_1009(self):
        # osr-testd caps messages at 16 MiB.
        evs = ws_client(self.url, {"steps": [{"binary": 16 * 1024 * 1024 + 1}]})
        self.assertEqual(events(evs, "close")[0]["code"], 1009)
        self.assertEqual(events(evs, "message"), [])

    def test_fragments_over_cap_1009(self):
        r = RawWs(self.d.port)
        chunk = b"a" * (1024 * 1024)
        frames = [frame(2, chunk, fin=False)] + [frame(0, chunk, fin=False)] * 16 + [frame(0, b"z")]
        try:
            for f in frames:
                r.send(f)
        except (BrokenPipeError, ConnectionResetError):
            pass
        code, _, before = r.wait_close()
        self.assertEqual(code, 1009)
        self.assertEqual(before, [])
        r.close()

    def test_invalid_utf8_from_ws_1007(self):
        evs = ws_client(self.url, {"steps": [{"raw_text_hex": "68c328"}]})
        self.assertEqual(events(evs, "close")[0]["code"], 1007)

    def test_invalid_utf8_fragmented_raw_1007(self):
        r = RawWs(self.d.port)
        r.send(frame(1, b"ok\xe2\x82", fin=False) + frame(0, b"\x28"))
        self.assertEqual(r.wait_close()[0], 1007)
        r.close()


class ProtocolErrors(WsCase):
    def expect_1002(self, data):
        r = RawWs(self.d.port)
        r.send(frame(1, b"fine") + data)
        code, _, before = r.wait_close()
        # Failing the connection may drop replies still queued (RFC 6455 7.1.7).
        self.assertIn(before, ([], [(1, b"fine")]))
        self.assertEqual(code, 1002)
        self.assertTrue(r.eof_after_close())
        r.close()

    def test_unmasked_frame(self):
        self.expect_1002(frame(1, b"plain", mask=False))

    def test_reserved_opcode(self):
        self.expect_1002(frame(3, b"x"))

    def test_reserved_bits(self):
        self.expect_1002(frame(1, b"x", rsv=4))
        self.expect_1002(frame(2, b"x", rsv=1))

    def test_continuation_without_start(self):
        self.expect_1002(frame(0, b"x"))

    def test_control_frame_too_long_or_fragmented(self):
        self.expect_1002(frame(9, b"p" * 126))
        self.expect_1002(frame(9, b"p", fin=False))

    def test_invalid_close_code(self):
        self.expect_1002(frame(8, struct.pack("!H", 1005)))


class Handshake(WsCase):
    def test_valid(self):
        r = RawWs(self.d.port, protocols=[b"x", b"chat.v2"])
        self.assertEqual(r.status, 101)
        self.assertEqual(r.headers["sec-websocket-accept"], accept_for(r.key).decode())
        self.assertEqual(r.headers["upgrade"].lower(), "websocket")
        self.assertIn("upgrade", r.headers["connection"].lower())
        self.assertEqual(r.headers["sec-websocket-protocol"], "chat.v2")
        # Frames sent right behind the request (same packet) are not lost.
        r.close()
        s = socket.create_connection(("127.0.0.1", self.d.port), timeout=10)
        key = base64.b64encode(os.urandom(16))
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n" +
                  frame(1, b"early"))
        buf = b""
        end = time.time() + 10
        while b"early" not in buf and time.time() < end:
            b = s.recv(65536)
            if not b:
                break
            buf += b
        self.assertIn(b"\r\n\r\n\x81\x05early", buf)
        s.close()

    def test_missing_key_400(self):
        r = RawWs(self.d.port, key=b"", expect_101=False)
        self.assertEqual(r.status, 400)
        r.close()

    def test_bad_key_400(self):
        r = RawWs(self.d.port, key=b"short==", expect_101=False)
        self.assertEqual(r.status, 400)
        r.close()

    def test_wrong_version_426(self):
        r = RawWs(self.d.port, version=b"8", expect_101=False)
        self.assertEqual(r.status, 426)
        self.assertEqual(r.headers.get("sec-websocket-version"), "13")
        r.close()

    def test_missing_upgrade_400(self):
        out = osrtest.raw_exchange(self.d.port, b"GET /ws HTTP/1.1\r\nHost: x\r\n"
                                   b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                   b"Sec-WebSocket-Version: 13\r\n\r\n", read_until_close=False)
        self.assertTrue(out.startswith(b"HTTP/1.1 400"), out[:200])


class Backpressure(WsCase):
    """A client that sends and never reads must not make the server buffer
    without bound: the echo queue is capped (4 MiB), then the server stops
    reading and TCP pushes back on the client."""

    LIMIT = 256 * 1024 * 1024

    def rss(self):
        out = osrtest.raw_exchange(self.d.port, b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return json.loads(out.partition(b"\r\n\r\n")[2].decode())["rss_kib"]

    def flood(self, chunk):
        r = RawWs(self.d.port)
        r.s.setblocking(False)
        sent = 0
        last_progress = time.time()
        view = memoryview(chunk)
        off = 0
        while sent < self.LIMIT and time.time() - last_progress < 3.0:
            try:
                n = r.s.send(view[off:])
            except BlockingIOError:
                time.sleep(0.01)
                continue
            sent += n
            off = (off + n) % len(chunk)
            last_progress = time.time()
        return r, sent

    def check(self, chunk):
        before = self.rss()
        r, sent = self.flood(chunk)
        after = self.rss()
        r.close()
        # Without backpressure the whole LIMIT goes through and the server
        # holds it all as queued echo/pong output.
        self.assertLess(sent, 64 * 1024 * 1024, "server kept reading a client that never reads")
        self.assertLess(after - before, 128 * 1024, "server RSS grew by %d KiB" % (after - before))
        # The server is still fine.
        evs = ws_client(self.url, {"steps": [{"text": "still here"}, {"wait": 1}, {"close": [1000, ""]}]})
        self.assertEqual(events(evs, "message")[0]["text"], "still here")

    def test_echo_flood(self):
        self.check(frame(2, os.urandom(1024 * 1024)))

    def test_ping_flood(self):
        self.check(b"".join(frame(9, b"p" * 125) for _ in range(8192)))


class Tls(unittest.TestCase):
    """wss:// on osr-testd's TLS listener (ALPN offers h2 and http/1.1; a
    WebSocket client gets HTTP/1.1)."""

    def setUp(self):
        need_node(self)
        self.certs = osrtest.Certs()
        self.d = Testd(tls=self.certs)

    def tearDown(self):
        self.d.stop()
        self.certs.cleanup()

    def test_npm_ws_over_tls(self):
        n = 1024 * 1024 + 3
        evs = ws_client("wss://127.0.0.1:%d/ws" % self.d.port, {
            "ca": self.certs.ca, "protocols": ["echo.v1"],
            "steps": [{"text": "secure"}, {"binary": n, "seed": 5}, {"wait": 2}, {"close": [4001, "bye"]}]})
        self.assertEqual(events(evs, "open")[0]["protocol"], "echo.v1")
        msgs = events(evs, "message")
        self.assertEqual(msgs[0]["text"], "secure")
        self.assertEqual(msgs[1]["sha"], sha(pattern(n, 5)))
        self.assertEqual(events(evs, "close")[0]["code"], 4001)

    def test_osr_wsc_over_tls(self):
        c = Wsc(self.d.port, "--tls", "--ca", self.certs.ca, "--subprotocol", "chat.v2", path="/ws")
        self.assertEqual(c.wait("open "), "open chat.v2")
        c.cmd("binary-random 200000")
        sent = c.wait("sent binary 200000 ").split()[3]
        c.wait("message binary 200000 " + sent)
        c.cmd("close 1000 done")
        self.assertEqual(c.wait("close "), "close 1000 done")
        self.assertEqual(c.exit_code(), 0)

    def test_osr_wsc_rejects_unknown_ca(self):
        c = Wsc(self.d.port, "--tls", path="/ws")
        line = c.wait("error ")
        self.assertEqual(int(line.split()[1]), -30002, line)  # OSR_ECERT
        self.assertEqual(c.exit_code(), 1)


# ==== osr-wsc -> npm ws WebSocketServer ==========================================

class NodeServer:
    def __init__(self):
        self.proc = Proc(["node", os.path.join(HERE, "ws_server.js")], env=NODE_ENV)
        self.port = int(self.proc.wait_line("listening ").split()[1])

    def stop(self):
        self.proc.stop()


class Wsc:
    def __init__(self, port, *args, path="/"):
        self.proc = Proc([WSC] + list(args) + ["127.0.0.1:%d" % port, path], stdin=subprocess.PIPE)

    def cmd(self, line):
        self.proc.p.stdin.write((line + "\n").encode())
        self.proc.p.stdin.flush()

    def wait(self, prefix, timeout=30):
        return self.proc.wait_line(prefix, timeout)

    def exit_code(self, timeout=20):
        try:
            return self.proc.p.wait(timeout)
        finally:
            self.proc.stop()


class Client(unittest.TestCase):
    def setUp(self):
        need_node(self)
        if not WSC:
            self.fail("OSR_WSC not set")
        self.srv = NodeServer()

    def tearDown(self):
        self.srv.stop()

    def test_echo_subprotocol_close(self):
        c = Wsc(self.srv.port, "--subprotocol", "echo.v1", "--subprotocol", "chat.v2")
        # ws_server.js picks the last protocol it knows of the offered ones.
        self.assertEqual(c.wait("open "), "open chat.v2")
        self.srv.proc.wait_line("conn chat.v2")
        t = "hello \u00e9".encode()
        c.cmd("text " + t.decode())
        c.wait("message text %d %s" % (len(t), sha(t)))
        with tempfile.NamedTemporaryFile(prefix="osr-wsc-") as f:
            data = pattern(3 * 1024 * 1024 + 5, 9)
            f.write(data)
            f.flush()
            c.cmd("binary-file " + f.name)
            c.wait("message binary %d %s" % (len(data), sha(data)))
        c.cmd("binary-random 100000")
        sent = c.wait("sent binary 100000 ").split()[3]
        c.wait("message binary 100000 " + sent)
        self.srv.proc.wait_line("message binary 100000 " + sent)
        c.cmd("text fragments")
        c.wait("message text 15 %s" % sha(b"part1part2part3"))
        c.cmd("text pings")
        self.srv.proc.wait_line("pong p1")
        self.srv.proc.wait_line("pong p2")
        c.cmd("ping hey")
        self.srv.proc.wait_line("ping hey")
        c.cmd("close 4001 bye")
        self.srv.proc.wait_line("close 4001 bye")
        self.assertEqual(c.wait("close "), "close 4001 bye")
        self.assertEqual(c.exit_code(), 0)

    def test_server_closes(self):
        c = Wsc(self.srv.port)
        self.assertEqual(c.wait("open "), "open -")
        c.cmd("text close:4002")
        self.assertEqual(c.wait("close "), "close 4002 requested")
        self.assertEqual(c.exit_code(), 0)

    def test_no_common_subprotocol(self):
        # ws_server.js then answers without a protocol: fine for us.
        c = Wsc(self.srv.port, "--subprotocol", "other.v1")
        self.assertEqual(c.wait("open "), "open -")
        c.cmd("close 1000 x")
        c.wait("close ")
        self.assertEqual(c.exit_code(), 0)

    def test_message_cap(self):
        c = Wsc(self.srv.port, "--max-message", "1000")
        c.wait("open ")
        c.cmd("binary-random 1001")
        # The echo exceeds our cap: we close with 1009 and ws reports it.
        self.srv.proc.wait_line("close 1009")
        c.wait("close ")
        self.assertEqual(c.exit_code(), 0)


class ScriptedServer:
    """A raw Python WebSocket server that runs `script(conn, request)` once."""

    def __init__(self, script):
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(1)
        self.ls.settimeout(20)
        self.port = self.ls.getsockname()[1]
        self.result = {}
        self.error = None
        self.t = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.t.start()

    def _run(self, script):
        try:
            conn, _ = self.ls.accept()
            conn.settimeout(15)
            buf = b""
            while b"\r\n\r\n" not in buf:
                b = conn.recv(4096)
                if not b:
                    return
                buf += b
            head = buf.partition(b"\r\n\r\n")[0]
            hdrs = {}
            for ln in head.split(b"\r\n")[1:]:
                k, _, v = ln.partition(b":")
                hdrs[k.strip().lower()] = v.strip()
            script(self, conn, hdrs)
            conn.close()
        except Exception as e:  # reported by join()
            self.error = e
        finally:
            self.ls.close()

    def join(self):
        self.t.join(30)
        if self.error is not None:
            raise self.error

    @staticmethod
    def read_client_frame(conn):
        def rd(n):
            b = b""
            while len(b) < n:
                c = conn.recv(n - len(b))
                if not c:
                    raise EOFError
                b += c
            return b
        b0, b1 = rd(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", rd(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", rd(8))[0]
        masked = bool(b1 & 0x80)
        key = rd(4) if masked else b"\0\0\0\0"
        p = bytes(c ^ key[i % 4] for i, c in enumerate(rd(n)))
        return b0 & 0xF, masked, p


def ok_101(hdrs, extra=b""):
    return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept_for(hdrs[b"sec-websocket-key"]) + b"\r\n" + extra + b"\r\n")


class ClientRejects(unittest.TestCase):
    def setUp(self):
        if not WSC:
            self.fail("OSR_WSC not set")

    def test_masked_server_frame_1002(self):
        def script(srv, conn, hdrs):
            srv.result["masked_request_ok"] = hdrs.get(b"sec-websocket-version") == b"13"
            conn.sendall(ok_101(hdrs) + frame(1, b"good", mask=False) + frame(1, b"masked", mask=True))
            while True:
                op, masked, p = ScriptedServer.read_client_frame(conn)
                srv.result.setdefault("client_masks", []).append(masked)
                if op == 8:
                    srv.result["code"] = struct.unpack("!H", p[:2])[0]
                    break
        srv = ScriptedServer(script)
        c = Wsc(srv.port)
        c.wait("open -")
        c.wait("message text 4 %s" % sha(b"good"))
        srv.join()
        self.assertEqual(srv.result.get("code"), 1002)
        self.assertTrue(all(srv.result["client_masks"]), "client frames must be masked")
        self.assertEqual(c.wait("close "), "close 1006 ")
        self.assertNotIn("message text 6", "\n".join(c.proc.lines))
        self.assertEqual(c.exit_code(), 0)

    def expect_open_error(self, answer, code):
        def script(srv, conn, hdrs):
            conn.sendall(answer(hdrs))
            time.sleep(0.5)
        srv = ScriptedServer(script)
        c = Wsc(srv.port, "--subprotocol", "echo.v1")
        line = c.wait("error ")
        self.assertEqual(int(line.split()[1]), code, line)
        self.assertEqual(c.exit_code(), 1)
        srv.join()

    def test_wrong_accept(self):
        self.expect_open_error(lambda h: ok_101({b"sec-websocket-key": b"x"}), -30005)

    def test_protocol_not_offered(self):
        self.expect_open_error(lambda h: ok_101(h, b"Sec-WebSocket-Protocol: chat.v2\r\n"), -30005)

    def test_not_101(self):
        self.expect_open_error(lambda h: b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", -30003)

    def test_endless_head(self):
        self.expect_open_error(lambda h: b"HTTP/1.1 101 OK\r\n" + b"X-Pad: " + b"a" * 20000, -30004)


if __name__ == "__main__":
    osrtest.run()
