"""The protobuf codec of process.Start/Connect (docs/agent.md "Binary codec
for Start and Connect"), which the data plane's exec sessions use: the real
osr-agent spoken to directly with application/connect+proto (events, raw
bytes of every value, the output offset extension, refusals), and
osr-dataplane in front of a hostile fake agent whose binary stream is
malformed (the session ends with a Failure status; the data plane lives on)."""
import http.client
import os
import socket
import struct
import sys
import threading
import unittest
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "lib"))
sys.path.insert(0, os.path.dirname(__file__))
import test_dataplane as tdp  # noqa: E402

SID = tdp.SID
PROTO = "application/connect+proto"


# ---- a minimal protobuf writer/reader for the test (independent of procpb.c) ----

def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(num, val):
    if isinstance(val, int):
        return varint(num << 3) + varint(val)
    if isinstance(val, str):
        val = val.encode()
    return varint(num << 3 | 2) + varint(len(val)) + val


def read_varint(b, i):
    v, shift = 0, 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def fields(b):
    """{num: [value, ...]} of one message (varints as int, LEN as bytes)."""
    out, i = {}, 0
    while i < len(b):
        key, i = read_varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(b, i)
        elif wt == 2:
            n, i = read_varint(b, i)
            v, i = bytes(b[i:i + n]), i + n
        else:
            raise AssertionError("unexpected wire type %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def event(msg):
    """(kind, fields of the member) of a Start/ConnectResponse."""
    ev = fields(fields(msg)[1][0])
    (num, vals), = ev.items()
    return {1: "start", 2: "data", 3: "end", 4: "keepalive"}[num], fields(vals[0])


def envelope(msg, flags=0):
    return struct.pack(">BI", flags, len(msg)) + msg


def envelopes(body):
    out, i = [], 0
    while i < len(body):
        fl, n = struct.unpack(">BI", body[i:i + 5])
        out.append((fl, body[i + 5:i + 5 + n]))
        i += 5 + n
    return out


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.path_ = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path_)


class AgentCodec(unittest.TestCase):
    def setUp(self):
        self.env = tdp.Env()

    def tearDown(self):
        self.assertEqual(self.env.close(), 0, self.env.dp.stderr_text()[-3000:])

    def call(self, method, msg, ctype=PROTO):
        c = UnixHTTP(self.env.sock)
        c.request("POST", "/process.Process/" + method if "/" not in method else method,
                  body=envelope(msg), headers={"Content-Type": ctype, "Connect-Protocol-Version": "1"})
        r = c.getresponse()
        body = r.read()
        c.close()
        return r, envelopes(body)

    def start_req(self, cmd, args=(), stdin=False):
        cfg = field(1, cmd) + b"".join(field(2, a) for a in args)
        return field(1, cfg) + field(4, 1 if stdin else 0)

    def collect(self, frames):
        """start pid, {stream: bytes}, end fields, end-of-stream JSON."""
        pid, out, end = None, {}, None
        for fl, msg in frames[:-1]:
            self.assertEqual(fl, 0)
            kind, f = event(msg)
            if kind == "start":
                pid = f
            elif kind == "data":
                (num, vals), = f.items()
                out[num] = out.get(num, b"") + vals[0]
            elif kind == "end":
                end = f
        self.assertEqual(frames[-1][0], 2)
        return pid, out, end, frames[-1][1]

    def test_events_raw_bytes_and_exit(self):
        r, frames = self.call("Start", self.start_req(
            "/bin/sh", ["-c", "printf out; printf err >&2; exit 3"]))
        self.assertEqual(r.status, 200)
        self.assertEqual(r.getheader("content-type"), PROTO)
        start, out, end, eos = self.collect(frames)
        self.assertEqual(event(frames[0][1])[0], "start", "the first event is start")
        self.assertGreater(start[1][0], 0)
        self.assertEqual(out, {1: b"out", 2: b"err"})
        # sint32 exit_code 3 (zigzag 6), exited, status and error as envd's
        self.assertEqual(end[1], [6])
        self.assertEqual(end[2], [1])
        self.assertEqual(end[3], [b"exit status 3"])
        self.assertEqual(end[4], [b"exit status 3"])
        self.assertEqual(eos, b"{}", "the end-of-stream message is JSON in both codecs")

    def test_all_byte_values_and_resume_from_offset(self):
        data = bytes(range(256)) * 1024 + os.urandom(300 * 1024)  # > 1 chunk, every value
        path = os.path.join(self.env.dir, "blob")
        with open(path, "wb") as f:
            f.write(data)
        r, frames = self.call("Start", self.start_req("cat", [path]))
        start, out, end, _ = self.collect(frames)
        self.assertEqual(out.get(1), data)
        self.assertEqual(end.get(1), None, "exit code 0 is not written (proto3 default)")
        # Re-attach to the exited process (kept 30 s) from an offset: the
        # OSR extension field 1000 both ways.
        off = len(data) - 1000
        r, frames = self.call("Connect", field(1, field(1, start[1][0])) + field(1000, off))
        self.assertEqual(r.status, 200)
        st, out2, end2, _ = self.collect(frames)
        self.assertEqual(st[1000], [off])
        self.assertEqual(out2.get(1), data[off:])
        self.assertEqual(end2[2], [1])

    def test_refusals(self):
        # Only Start and Connect are served binary.
        r, frames = self.call("/filesystem.Filesystem/WatchDir", field(1, "/tmp"))
        self.assertEqual(r.status, 200)
        self.assertEqual(frames[-1][0], 2)
        self.assertIn(b'"unimplemented"', frames[-1][1])
        # A malformed message: a LEN field running past the end.
        r, frames = self.call("Start", b"\x0a\x7f\x0a")
        self.assertIn(b'"invalid_argument"', frames[-1][1])
        # A string that is not UTF-8.
        r, frames = self.call("Start", field(1, field(1, b"\xff\xfe")))
        self.assertIn(b'"invalid_argument"', frames[-1][1])
        # The JSON codec still answers the same method in JSON.
        c = UnixHTTP(self.env.sock)
        msg = b'{"process":{"cmd":"true"}}'
        c.request("POST", "/process.Process/Start", body=envelope(msg),
                  headers={"Content-Type": "application/connect+json"})
        rr = c.getresponse()
        body = rr.read()
        c.close()
        self.assertEqual(rr.getheader("content-type"), "application/connect+json")
        self.assertTrue(envelopes(body)[0][1].startswith(b'{"event":{"start":'))


class HostileAgent:
    """A unix listener answering every request with 200 connect+proto and the
    given stream body, then closing."""

    def __init__(self, path, body):
        self.body = body
        self.requests = []
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.bind(path)
        self.s.listen(16)
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
            c.settimeout(5)
            buf = b""
            try:
                while b"\r\n\r\n" not in buf and len(buf) < 65536:
                    d = c.recv(65536)
                    if not d:
                        break
                    buf += d
                self.requests.append(buf.split(b"\r\n", 1)[0])
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+proto\r\n"
                          b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(self.body)
                          + self.body)
            except OSError:
                pass
            c.close()

    def close(self):
        self.stop_ = True
        self.t.join(2)
        self.s.close()


class ExecHostileAgent(unittest.TestCase):
    """What the data plane does with a malformed binary stream."""

    def setUp(self):
        self.env = tdp.Env()
        self.fakes = []

    def tearDown(self):
        for f in self.fakes:
            f.close()
        self.assertEqual(self.env.close(), 0, self.env.dp.stderr_text()[-3000:])

    def exec_post(self, body):
        path = os.path.join(self.env.dir, "fake%d.sock" % len(self.fakes))
        fake = HostileAgent(path, body)
        self.fakes.append(fake)
        tok = self.env.token(ep="unix:" + path)
        q = urllib.parse.urlencode([("command", "true"), ("access_token", tok)])
        c = http.client.HTTPConnection("127.0.0.1", self.env.port, timeout=30)
        c.request("POST", "/v1/sandboxes/%s/exec?%s" % (SID, q), body=b"")
        r = c.getresponse()
        data = r.read()
        c.close()
        self.assertEqual(r.status, 200)
        frames, i = [], 0
        while i + 4 <= len(data):
            n, = struct.unpack(">I", data[i:i + 4])
            frames.append((data[i + 4], data[i + 5:i + 4 + n]))
            i += 4 + n
        # The data plane tries h2c first (its shared exec connections); this
        # HTTP/1.1-only fake answers the preface with garbage, so the
        # session falls back to its own HTTP/1.1 connection.
        self.assertTrue([q for q in fake.requests if q.startswith(b"POST /process.Process/Start")],
                        fake.requests)
        return frames

    def status(self, frames):
        st = [p for ch, p in frames if ch == 3]
        self.assertEqual(len(st), 1, frames)
        return st[0]

    def test_malformed_streams_end_in_failure(self):
        start = field(1, field(1, field(1, 42)))
        cases = [
            # a data event whose bytes field claims more than the message holds
            envelope(start) + envelope(b"\x0a\x05\x12\x03\x0a\x7f\x41"),
            # a varint that never ends
            envelope(start) + envelope(b"\x0a\x0b" + b"\xff" * 11),
            # a group wire type
            envelope(start) + envelope(b"\x0b"),
            # the event with the wrong wire type for a known field
            envelope(start) + envelope(b"\x08\x01"),
            # an envelope larger than the data plane's cap (256 KiB + 64)
            envelope(start) + struct.pack(">BI", 0, 1 << 30) + b"x" * 100,
            # a compressed flag we never negotiated
            envelope(start, 1),
        ]
        for body in cases:
            frames = self.exec_post(body)
            st = self.status(frames)
            self.assertIn(b'"Failure"', st, (body[:40], st))
            self.assertIn(b"InternalError", st, (body[:40], st))
            self.assertFalse([p for ch, p in frames if ch in (1, 2)], "no output relayed")
        # Unknown fields and event kinds are skipped (proto3): output, then end.
        good = (envelope(field(99, "x") + start)
                + envelope(field(1, field(7, "future event")))
                + envelope(field(1, field(2, field(1, b"hi\x00\xff")))))
        good += envelope(field(1, field(3, field(2, 1) + field(3, "exit status 0"))))
        good += envelope(b"{}", 2)
        frames = self.exec_post(good)
        self.assertEqual([p for ch, p in frames if ch == 1], [b"hi\x00\xff"])
        self.assertIn(b'"Success"', self.status(frames))
        # The data plane still serves the real agent.
        tok = self.env.token()
        q = urllib.parse.urlencode([("command", "echo"), ("command", "alive"),
                                    ("access_token", tok)])
        c = http.client.HTTPConnection("127.0.0.1", self.env.port, timeout=30)
        c.request("POST", "/v1/sandboxes/%s/exec?%s" % (SID, q), body=b"")
        data = c.getresponse().read()
        c.close()
        self.assertIn(b"\x01alive\n", data)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[1:], verbosity=2)
