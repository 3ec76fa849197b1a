#!/usr/bin/env python3
"""splice(2) in the relays (net/splice.c), through osr-dataplane and the
real osr-agent's port tunnel: a 24 MiB download read slowly and a 24 MiB
upload are byte-exact, with splice on (OSR_SPLICE unset) and off
(OSR_SPLICE=0). That the bulk direction really switched to splice(2) is
checked in the agent: with splice on its relay holds a pipe while the slow
download is paused (and none with OSR_SPLICE=0), so a splice that silently
stayed on the copy path fails the test.
"""
import fcntl
import hashlib
import hmac
import http.server
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import test_dataplane as tdp  # noqa: E402  (Env, SID, the osrtest path)
import osrtest  # noqa: E402

BIG = os.urandom(1 << 20) * 24


class Backend(http.server.BaseHTTPRequestHandler):
    """GET -> BIG; POST -> sha256 hex of the body read."""
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(BIG)))
        self.end_headers()
        self.wfile.write(BIG)

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

    def log_message(self, *a):
        pass


def pipes(pid):
    n = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("pipe:"):
                n += 1
        except OSError:
            pass
    return n


def big_pipes(pid):
    """Pipes of pid at net/splice.c's 1 MiB (F_GETPIPE_SZ on the pipe opened
    again through /proc: the same pipe, nothing is read from it)."""
    n = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        path = "/proc/%d/fd/%s" % (pid, fd)
        try:
            if not os.readlink(path).startswith("pipe:"):
                continue
            f = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            n += fcntl.fcntl(f, fcntl.F_GETPIPE_SZ) >= 1 << 20
        finally:
            os.close(f)
    return n


def pipe_max():
    with open("/proc/sys/fs/pipe-max-size") as f:
        return int(f.read())


def check_pipes(tc, pid, base, splice, what):
    """With splice on, `pid` comes to hold a pipe more than `base` within
    5 s (the relay switched while it is backed up); with OSR_SPLICE=0 it
    holds none more, 1 s later too."""
    extra = 0
    for _ in range(50):
        extra = pipes(pid) - base
        if extra > 0 or not splice:
            break
        time.sleep(0.1)
    if splice:
        tc.assertGreater(extra, 0, "%s never switched to splice(2)" % what)
        if pipe_max() >= 1 << 20:  # what F_SETPIPE_SZ grants without privilege
            tc.assertGreater(big_pipes(pid), 0, "%s: the splice pipe is not 1 MiB" % what)
    else:
        time.sleep(1)
        tc.assertEqual(pipes(pid) - base, 0, "OSR_SPLICE=0 still spliced")


class Splice(unittest.TestCase):
    def setUp(self):
        # The agent's byte tunnel is what is tested here: without this it
        # hands the data plane the port's socket itself (osr-fd, docs/agent.md;
        # that path is tested in test_fdpass.py).
        os.environ["OSR_FDPASS"] = "0"
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
        self.port = self.srv.server_address[1]
        self.t = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.t.start()

    def tearDown(self):
        self.srv.shutdown()
        self.srv.server_close()
        os.environ.pop("OSR_SPLICE", None)
        os.environ.pop("OSR_FDPASS", None)

    def run_mode(self, splice):
        if splice:
            os.environ.pop("OSR_SPLICE", None)
        else:
            os.environ["OSR_SPLICE"] = "0"
        env = tdp.Env()
        try:
            agent_pid = env.agent.p.pid
            base = pipes(agent_pid)  # the agent's own (process plumbing)
            tok = env.token(scopes="ports", ports=str(self.port))
            # Slow download: read 1 MiB, pause while the relay is backed up.
            s = socket.create_connection(("127.0.0.1", env.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            s.sendall(("GET /sbx/%s/%d/big HTTP/1.1\r\nHost: x\r\nX-Access-Token: %s\r\n\r\n"
                       % (tdp.SID, self.port, tok)).encode())
            buf = bytearray()
            while len(buf) < (1 << 20):
                d = s.recv(65536)
                self.assertTrue(d, "closed early")
                buf += d
            check_pipes(self, agent_pid, base, splice, "the agent's relay")
            s.settimeout(60)
            hl = buf.index(b"\r\n\r\n") + 4
            deadline = time.time() + 120
            while len(buf) - hl < len(BIG) and time.time() < deadline:
                d = s.recv(1 << 20)
                self.assertTrue(d, "closed early")
                buf += d
            s.close()
            self.assertEqual(len(buf) - hl, len(BIG))
            self.assertEqual(hashlib.sha256(bytes(buf[hl:])).digest(), hashlib.sha256(BIG).digest())
            # Upload: byte-exact through the tunnel (client -> sandbox direction).
            r, data = env.request("POST", "/sbx/%s/%d/up" % (tdp.SID, self.port),
                                  {"X-Access-Token": tok, "Content-Type": "application/octet-stream"},
                                  BIG, timeout=120)
            self.assertEqual(r.status, 200)
            self.assertEqual(data.decode(), hashlib.sha256(BIG).hexdigest())
        finally:
            self.assertEqual(env.close(), 0)

    def test_splice_on(self):
        self.run_mode(True)

    def test_splice_off(self):
        self.run_mode(False)


class AgentTokenMemo(unittest.TestCase):
    """The data plane memoises the agent's derived token per endpoint
    (proxy.c agent_token_for): requests for the right sandbox keep passing
    the agent's check, and a request naming another sandbox on the same
    endpoint gets that sandbox's token (refused by this agent), not the
    memoised one."""

    def test_memo_follows_the_sandbox(self):
        d = tempfile.mkdtemp(prefix="osr-dp-sec-")
        secret = os.urandom(32)
        path = os.path.join(d, "agent.secret")
        with open(path, "w") as f:
            f.write(secret.hex() + "\n")
        os.environ["OSR_AGENT_TOKEN"] = hmac.new(secret, tdp.SID.encode(), hashlib.sha256).hexdigest()
        try:
            env = tdp.Env(extra=["--agent-secret-file", path])
        finally:
            os.environ.pop("OSR_AGENT_TOKEN", None)
        try:
            # envd requests: the agent checks X-Access-Token on every request
            # (tunnels are checked once, when opened, and pooled per endpoint).
            fpath = os.path.join(env.dir, "f.txt")
            with open(fpath, "wb") as f:
                f.write(b"abc")

            def get(sid):
                tok = env.token(sid=sid, scopes="files")
                r, data = env.request("GET", "/sbx/%s/%d/files?path=%s" % (sid, tdp.ENVD, fpath),
                                      {"X-Access-Token": tok})
                return r.status, data
            for sid in (tdp.SID, tdp.SID, "other", tdp.SID, "other", "other", tdp.SID):
                with self.subTest(sid=sid):
                    st, data = get(sid)
                    if sid == tdp.SID:
                        self.assertEqual((st, data), (200, b"abc"))
                    else:
                        self.assertIn(st, (401, 403), data)  # the agent refused that token
        finally:
            self.assertEqual(env.close(), 0)
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    osrtest.run()
