#!/usr/bin/env python3
"""Descriptor passing (osr-fd, docs/agent.md and docs/dataplane.md): the real
osr-agent on a unix socket connects to the port and hands the connected
socket to the real osr-dataplane (SCM_RIGHTS), which then talks to the
sandbox's server directly.

FdPass: HTTP and WebSocket traffic through the passed socket is byte-exact
both ways (64 MiB each way, a WebSocket echo). That the socket really was
passed is checked in /proc: the connection to the backend belongs to the
data plane's process and none to the agent's; with OSR_FDPASS=0 in the
agent's environment the same check finds the agent holding it (the tunnel),
so the check can tell the two paths apart.

FdPassHostile: a fake agent (a Python unix listener, as a compromised agent
inside a sandbox could behave) answers the handshake with no descriptor,
two, a pipe, a listening socket, a UDP socket, a unix socket, an unconnected
TCP socket, a flood of descriptors (MSG_CTRUNC), a descriptor with the
tunnel tag or unannounced, or garbage: each request gets a 502, no received
descriptor stays open in the data plane, and the data plane goes on serving
(a well-behaved fake agent that passes a real connection works between and
after them).
"""
import array
import base64
import hashlib
import http.server
import os
import socket
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import test_dataplane as tdp  # noqa: E402
import osrtest  # noqa: E402

BIG = os.urandom(1 << 20) * 64  # 64 MiB


class Backend(http.server.BaseHTTPRequestHandler):
    """GET /big -> BIG; GET /small -> b"ok"; POST -> sha256 hex of the body;
    GET with Upgrade: websocket -> an echo WebSocket (unmasked frames)."""
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        body = BIG if self.path == "/big" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        h = hashlib.sha256()
        while n > 0:
            d = self.rfile.read(min(n, 1 << 20))
            if not d:
                break
            h.update(d)
            n -= len(d)
        body = h.hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
                                            .encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc)
        self.end_headers()
        self.wfile.flush()
        for _ in range(1000):  # bounded: the test sends a handful of messages
            op, data = ws_read(self.rfile)
            if op is None or op == 8:
                return
            self.wfile.write(ws_frame(op, data, mask=False))
            self.wfile.flush()

    def log_message(self, *a):
        pass


def ws_frame(op, data, mask):
    n = len(data)
    hdr = bytes([0x80 | op])
    mbit = 0x80 if mask else 0
    if n < 126:
        hdr += bytes([mbit | n])
    elif n < 65536:
        hdr += bytes([mbit | 126]) + struct.pack(">H", n)
    else:
        hdr += bytes([mbit | 127]) + struct.pack(">Q", n)
    if mask:
        k = os.urandom(4)
        data = bytes(b ^ k[i % 4] for i, b in enumerate(data))
        hdr += k
    return hdr + data


def ws_read(f):
    h = f.read(2)
    if len(h) < 2:
        return None, None
    op = h[0] & 0x0F
    n = h[1] & 0x7F
    if n == 126:
        n = struct.unpack(">H", f.read(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", f.read(8))[0]
    k = f.read(4) if h[1] & 0x80 else None
    data = f.read(n)
    if k:
        data = bytes(b ^ k[i % 4] for i, b in enumerate(data))
    return op, data


def relay(a, b):
    """Copy bytes both ways until either side ends (bounded by timeouts)."""
    a.settimeout(10)
    b.settimeout(10)

    def pump(src, dst):
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                dst.sendall(d)
        except OSError:
            pass
        for x in (src, dst):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    t = threading.Thread(target=pump, args=(b, a), daemon=True)
    t.start()
    pump(a, b)
    t.join(15)


def socket_inodes(pid):
    out = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if t.startswith("socket:["):
            out.add(t[8:-1])
    return out


def client_inodes(port):
    """Inodes of TCP sockets connected to 127.0.0.1:port (the client ends)."""
    out = set()
    for tab in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(tab).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            rport = int(f[2].split(":")[1], 16)
            if rport == port and f[3] == "01":  # ESTABLISHED
                out.add(f[9])
    return out


def holders(port, pids):
    """Which of pids ({name: pid}) hold a connection to the backend port."""
    conns = client_inodes(port)
    return sorted(n for n, p in pids.items() if socket_inodes(p) & conns)


def settled_holders(port, pids):
    """holders() once exactly one process holds the backend connection.

    On the passed path the agent close()s its copy in the same callback,
    right after the sendmsg() that passed it, but the data plane can use
    the socket before the agent's next system call runs (a preempted agent
    on a loaded machine: reproduced by delaying the agent's close() with
    strace's fault injection), so both can hold it for a moment. On the
    tunnel path only the agent ever holds it. Wait for one holder, bounded
    (the normal case is the first look)."""
    deadline = time.time() + 20
    while True:
        who = holders(port, pids)
        if len(who) == 1 or time.time() >= deadline:
            return who
        time.sleep(0.02)


class BackendMixin:
    def start_backend(self, handler=Backend):
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.bport = self.srv.server_address[1]
        self.t = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.t.start()

    def stop_backend(self):
        self.srv.shutdown()
        self.srv.server_close()


class FdPass(unittest.TestCase, BackendMixin):
    def setUp(self):
        self.start_backend()

    def tearDown(self):
        self.stop_backend()
        os.environ.pop("OSR_FDPASS", None)

    def download_paused(self, env, tok):
        """Start a 64 MiB download, read 1 MiB, report who holds the backend
        connection while the rest is backed up, then finish and check it."""
        s = socket.create_connection(("127.0.0.1", env.port))
        s.settimeout(60)
        s.sendall(("GET /sbx/%s/%d/big HTTP/1.1\r\nHost: x\r\nX-Access-Token: %s\r\n\r\n"
                   % (tdp.SID, self.bport, tok)).encode())
        buf = bytearray()
        while len(buf) < (1 << 20):
            d = s.recv(65536)
            self.assertTrue(d, "closed early")
            buf += d
        who = settled_holders(self.bport, {"agent": env.agent.p.pid, "dataplane": env.dp.p.pid})
        hl = buf.index(b"\r\n\r\n") + 4
        self.assertIn(b" 200 ", bytes(buf[:hl]))
        deadline = time.time() + 180
        while len(buf) - hl < len(BIG) and time.time() < deadline:
            d = s.recv(1 << 20)
            self.assertTrue(d, "closed early")
            buf += d
        s.close()
        self.assertEqual(len(buf) - hl, len(BIG))
        self.assertEqual(hashlib.sha256(bytes(buf[hl:])).digest(), hashlib.sha256(BIG).digest())
        return who

    def websocket(self, env, tok):
        s = socket.create_connection(("127.0.0.1", env.port))
        s.settimeout(30)
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(("GET /sbx/%s/%d/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
                   "X-Access-Token: %s\r\n\r\n" % (tdp.SID, self.bport, key, tok)).encode())
        f = s.makefile("rb")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            c = f.read(1)
            self.assertTrue(c, "closed during the upgrade: %r" % head)
            head += c
        self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
        who = settled_holders(self.bport, {"agent": env.agent.p.pid, "dataplane": env.dp.p.pid})
        for n in (0, 1, 125, 126, 65535, 65536, 1 << 20):
            msg = os.urandom(n)
            s.sendall(ws_frame(2, msg, mask=True))
            op, data = ws_read(f)
            self.assertEqual(op, 2)
            self.assertEqual(hashlib.sha256(data).digest(), hashlib.sha256(msg).digest(), n)
        s.sendall(ws_frame(8, b"", mask=True))
        f.close()
        s.close()
        return who

    def run_all(self, env):
        tok = env.token(scopes="ports", ports=str(self.bport))
        who_dl = self.download_paused(env, tok)
        r, data = env.request("POST", "/sbx/%s/%d/up" % (tdp.SID, self.bport),
                              {"X-Access-Token": tok, "Content-Type": "application/octet-stream"},
                              BIG, timeout=180)
        self.assertEqual(r.status, 200)
        self.assertEqual(data.decode(), hashlib.sha256(BIG).hexdigest())
        # Keep-alive reuse of the pooled connection: many small requests.
        for _ in range(50):
            r, data = env.request("GET", "/sbx/%s/%d/small" % (tdp.SID, self.bport),
                                  {"X-Access-Token": tok})
            self.assertEqual((r.status, data), (200, b"ok"))
        who_ws = self.websocket(env, tok)
        return who_dl, who_ws

    def test_passed_socket(self):
        env = tdp.Env()
        try:
            who_dl, who_ws = self.run_all(env)
            self.assertEqual(who_dl, ["dataplane"], "the download did not run on a passed socket")
            self.assertEqual(who_ws, ["dataplane"], "the WebSocket did not run on a passed socket")
        finally:
            self.assertEqual(env.close(), 0)

    def test_tunnel_when_the_agent_declines(self):
        os.environ["OSR_FDPASS"] = "0"  # the agent answers as an agent without the extension
        env = tdp.Env()
        try:
            who_dl, who_ws = self.run_all(env)
            self.assertEqual(who_dl, ["agent"])
            self.assertEqual(who_ws, ["agent"])
        finally:
            self.assertEqual(env.close(), 0)


# ---- a hostile agent ---------------------------------------------------------

HEAD_FD = (b"HTTP/1.1 101 Switching Protocols\r\nupgrade: osr-tcp\r\nconnection: Upgrade\r\n"
           b"osr-fd: 1\r\n\r\n")
HEAD_PLAIN = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: osr-tcp\r\nconnection: Upgrade\r\n\r\n"


class FakeAgent:
    """A unix listener answering GET /_osr/ports/N as told by `mode`."""

    def __init__(self, path, bport):
        self.path = path
        self.bport = bport
        self.mode = "good"
        self.seen = 0
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
            # One thread per connection: a relay ('T') lasts as long as the
            # data plane keeps the tunnel pooled.
            threading.Thread(target=self._serve_close, args=(c,), daemon=True).start()

    def _serve_close(self, c):
        try:
            self._serve(c)
        except OSError:
            pass
        finally:
            c.close()

    def _serve(self, c):
        c.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            d = c.recv(4096)
            if not d:
                return
            head += d
        self.seen += 1
        self.last_head = head
        m = self.mode
        keep = []  # descriptors sent, closed after sendmsg (the receiver has its own)

        def send(data, fds=()):
            if fds:
                c.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                c.sendall(data)

        def tcp_to_backend():
            t = socket.create_connection(("127.0.0.1", self.bport))
            keep.append(t)
            return t.fileno()

        if m == "good":
            send(HEAD_FD)
            send(b"F", [tcp_to_backend()])
        elif m == "tunnel_tag":
            # What the agent does where the kernel refuses to pass the
            # socket (gVisor): the 'T' tag, then a byte tunnel.
            t = socket.create_connection(("127.0.0.1", self.bport))
            keep.append(t)
            send(HEAD_FD + b"T")
            relay(c, t)
        elif m == "zero":
            send(HEAD_FD + b"F")
        elif m == "two":
            send(HEAD_FD)
            send(b"F", [tcp_to_backend(), tcp_to_backend()])
        elif m == "pipe":
            r, w = os.pipe()
            send(HEAD_FD)
            send(b"F", [r])
            os.close(r)
            os.close(w)
        elif m == "listening":
            ls = socket.socket()
            ls.bind(("127.0.0.1", 0))
            ls.listen(1)
            keep.append(ls)
            send(HEAD_FD)
            send(b"F", [ls.fileno()])
        elif m == "udp":
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.connect(("127.0.0.1", self.bport))
            keep.append(u)
            send(HEAD_FD)
            send(b"F", [u.fileno()])
        elif m == "unix":
            a, b = socket.socketpair()
            keep += [a, b]
            send(HEAD_FD)
            send(b"F", [a.fileno()])
        elif m == "unconnected":
            t = socket.socket()
            keep.append(t)
            send(HEAD_FD)
            send(b"F", [t.fileno()])
        elif m == "flood":
            fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(40)]
            send(HEAD_FD)
            try:
                send(b"F", fds)
            finally:
                for fd in fds:
                    os.close(fd)
        elif m == "tunnel_tag_with_fd":
            send(HEAD_FD)
            send(b"T", [tcp_to_backend()])
        elif m == "unannounced":
            send(HEAD_PLAIN)
            send(b"G", [tcp_to_backend()])
        elif m == "fd_in_head":
            send(HEAD_FD[:20], [tcp_to_backend()])
            send(HEAD_FD[20:] + b"F")
        elif m == "garbage":
            send(b"\x00\xffnot http at all\r\n\r\n")
        elif m == "bad_tag":
            send(HEAD_FD + b"X")
        elif m == "bytes_after_tag":
            send(HEAD_FD)
            send(b"Fzz", [tcp_to_backend()])
        elif m == "close":
            pass
        # Give the data plane time to read before our close races it.
        time.sleep(0.05)
        for k in keep:
            k.close()

    def close(self):
        self.stop_ = True
        self.t.join(5)
        self.s.close()


HOSTILE = ["zero", "two", "pipe", "listening", "udp", "unix", "unconnected", "flood",
           "tunnel_tag_with_fd", "unannounced", "fd_in_head", "garbage", "bad_tag",
           "bytes_after_tag", "close"]


class FdPassHostile(unittest.TestCase, BackendMixin):
    def setUp(self):
        self.start_backend()

    def tearDown(self):
        self.stop_backend()

    def test_hostile_agent(self):
        env = tdp.Env()
        fake = FakeAgent(os.path.join(env.dir, "fake.sock"), self.bport)
        try:
            ep = "unix:" + fake.path
            tok = env.token(scopes="ports", ports=str(self.bport), ep=ep)
            dp_pid = env.dp.p.pid
            base_fds = osrtest.fd_count(dp_pid)

            def get():
                return env.request("GET", "/sbx/%s/%d/small" % (tdp.SID, self.bport),
                                   {"X-Access-Token": tok, "Connection": "close"}, timeout=30)

            fake.mode = "good"
            r, data = get()
            self.assertEqual((r.status, data), (200, b"ok"))
            self.assertIn(b"osr-fd: 1", fake.last_head)
            self.assertNotIn(tok.encode(), fake.last_head)  # the client's token stays with us
            # The pooled direct connection is reused: no new handshake.
            n = fake.seen
            r, data = env.request("GET", "/sbx/%s/%d/small" % (tdp.SID, self.bport),
                                  {"X-Access-Token": tok}, timeout=30)
            self.assertEqual((r.status, data), (200, b"ok"))
            self.assertEqual(fake.seen, n)
            # The tunnel tag: the same request through the fake agent's relay.
            srv3 = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
            threading.Thread(target=srv3.serve_forever, daemon=True).start()
            try:
                fake.bport = p3 = srv3.server_address[1]
                fake.mode = "tunnel_tag"
                tok3 = env.token(scopes="ports", ports=str(p3), ep=ep)
                r, data = env.request("GET", "/sbx/%s/%d/small" % (tdp.SID, p3),
                                      {"X-Access-Token": tok3, "Connection": "close"}, timeout=30)
                self.assertEqual((r.status, data), (200, b"ok"))
            finally:
                srv3.shutdown()
                srv3.server_close()
            # The pool is per endpoint and port: each case gets a backend
            # of its own, so it starts with a handshake.
            for mode in HOSTILE:
                with self.subTest(mode=mode):
                    srv2 = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
                    t2 = threading.Thread(target=srv2.serve_forever, daemon=True)
                    t2.start()
                    try:
                        p2 = srv2.server_address[1]
                        fake.bport = p2
                        tok2 = env.token(scopes="ports", ports=str(p2), ep=ep)
                        fake.mode = mode
                        seen = fake.seen
                        r, data = env.request("GET", "/sbx/%s/%d/small" % (tdp.SID, p2),
                                              {"X-Access-Token": tok2}, timeout=30)
                        self.assertEqual(r.status, 502, (mode, data))
                        self.assertEqual(fake.seen, seen + 1)
                        # Still serving: a good handshake right after.
                        fake.mode = "good"
                        r, data = env.request("GET", "/sbx/%s/%d/small" % (tdp.SID, p2),
                                              {"X-Access-Token": tok2, "Connection": "close"},
                                              timeout=30)
                        self.assertEqual((r.status, data), (200, b"ok"), mode)
                    finally:
                        srv2.shutdown()
                        srv2.server_close()
            # Nothing received stays open: once the 2 s idle sweep closed the
            # pooled connections of the good cases, the data plane holds no
            # more descriptors than before the first request.
            deadline = time.time() + 15
            while osrtest.fd_count(dp_pid) > base_fds and time.time() < deadline:
                time.sleep(0.2)
            self.assertLessEqual(osrtest.fd_count(dp_pid), base_fds)
            self.assertIn("descriptor handshake refused", env.dp.stderr_text())
        finally:
            fake.close()
            self.assertEqual(env.close(), 0)


if __name__ == "__main__":
    osrtest.run()
