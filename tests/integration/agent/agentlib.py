"""Helpers for the osr-agent integration tests: start the agent, speak the
Connect protocol (JSON codec) to it over HTTP/1.1 on TCP or a unix socket.
Stdlib only."""
import base64
import http.client
import json
import os
import socket
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "lib"))
import osrtest  # noqa: E402

AGENT = os.environ.get("OSR_AGENT", "")


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=30):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class Agent:
    """osr-agent on a TCP port and a unix socket, with an access token."""

    def __init__(self, token="tok-" + os.urandom(8).hex(), extra=(), env=None):
        self.dir = tempfile.mkdtemp(prefix="osr-agent-")
        self.sock_path = os.path.join(self.dir, "agent.sock")
        self.token = token
        args = [AGENT, "--listen", "127.0.0.1:0", "--listen", "unix:" + self.sock_path]
        e = dict(env or {})
        if token is not None:
            tf = os.path.join(self.dir, "token")
            with open(tf, "w") as f:
                f.write(token + "\n")
            args += ["--token-file", tf]
        self.proc = osrtest.Proc(args + list(extra), env=e)
        ln = self.proc.wait_line("listening 127.0.0.1:0 ")
        self.port = int(ln.split()[-1])
        self.proc.wait_line("ready")

    def stop(self):
        """SIGTERM the agent (it kills its children) and require a clean
        exit: a sanitizer report or a leak makes the exit code non-zero."""
        rc = self.proc.stop()
        osrtest.shutil.rmtree(self.dir, ignore_errors=True)
        if rc != 0:
            raise AssertionError("osr-agent exited %r:\n%s" % (rc, self.proc.stderr_text()[-6000:]))
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def conn(self, unix=False, timeout=60):
        if unix:
            return UnixHTTPConnection(self.sock_path, timeout=timeout)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def headers(self, extra=None, token=True):
        h = {"Connect-Protocol-Version": "1"}
        if token and self.token is not None:
            h["X-Access-Token"] = self.token if token is True else token
        if extra:
            h.update(extra)
        return h

    def unary(self, method, msg, unix=False, token=True, headers=None):
        """POST a unary call; returns (http_status, json_body)."""
        c = self.conn(unix)
        body = json.dumps(msg).encode()
        h = self.headers(headers, token)
        h["Content-Type"] = "application/json"
        c.request("POST", "/" + method, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        try:
            return r.status, json.loads(data) if data else None
        except ValueError:
            return r.status, data

    def stream(self, method, msg, unix=False, token=True, headers=None, timeout=120):
        """Open a server stream; returns a Stream to iterate frames from."""
        c = self.conn(unix, timeout=timeout)
        body = json.dumps(msg).encode()
        env = struct.pack(">BI", 0, len(body)) + body
        h = self.headers(headers, token)
        h["Content-Type"] = "application/connect+json"
        c.request("POST", "/" + method, body=env, headers=h)
        r = c.getresponse()
        return Stream(c, r)

    def http(self, method, path, body=None, headers=None, token=True, unix=False, timeout=120):
        c = self.conn(unix, timeout=timeout)
        h = self.headers(headers, token)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r, data


class Stream:
    def __init__(self, conn, resp):
        self.conn = conn
        self.resp = resp
        self.status = resp.status
        self.end = None  # the end-of-stream JSON

    def _readn(self, n):
        buf = b""
        while len(buf) < n:
            b = self.resp.read(n - len(buf))
            if not b:
                raise EOFError("stream ended after %d of %d bytes" % (len(buf), n))
            buf += b
        return buf

    def frames(self):
        """Yield JSON messages until the end-of-stream frame (stored in .end)."""
        while True:
            hdr = self._readn(5)
            flags, n = struct.unpack(">BI", hdr)
            msg = json.loads(self._readn(n)) if n else {}
            if flags & 0x02:
                self.end = msg
                return
            if flags != 0:
                raise AssertionError("bad flags %d" % flags)
            yield msg

    def close(self):
        # shutdown() first: it wakes a thread blocked reading this stream,
        # which close() alone would wait for until the socket timeout.
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


def collect_process(stream, on_frame=None):
    """Drain a Start/Connect stream: returns (start, stdout, stderr, end, eos,
    frames). The first frame must be start (contract §10)."""
    out, err = bytearray(), bytearray()
    start = end = None
    frames = []
    for i, f in enumerate(stream.frames()):
        frames.append(f)
        ev = f.get("event", {})
        if i == 0 and "start" not in ev:
            raise AssertionError("first frame is not start: %r" % f)
        if "start" in ev:
            start = ev["start"]
        elif "data" in ev:
            d = ev["data"]
            if "stdout" in d:
                out += base64.b64decode(d["stdout"])
            if "stderr" in d:
                err += base64.b64decode(d["stderr"])
            if "pty" in d:
                out += base64.b64decode(d["pty"])
        elif "end" in ev:
            end = ev["end"]
        if on_frame is not None:
            on_frame(f)
    stream.close()
    return start, bytes(out), bytes(err), end, stream.end, frames


def b64(b):
    return base64.b64encode(b).decode()
