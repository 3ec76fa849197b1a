#!/usr/bin/env python3
"""Spliced response bodies (docs/dataplane.md "Zero copy"): a large
Content-Length body from a port inside the sandbox goes from the sandbox's
socket to the client's with splice(2) (net/splice.c osr_splice_xfer_t),
through the real osr-agent and the real osr-dataplane, on the passed socket
(osr-fd) and on the agent's tunnel (OSR_FDPASS=0).

BodySplice, for each upstream path:
  - a 64 MiB download read by a slow client (small receive buffer, paused
    after 1 MiB) is byte-exact; while it is paused the data plane holds a
    pipe (the body is spliced, not copied) and its resident memory grew by
    less than 16 MiB (backpressure: the sandbox is not read ahead);
  - a keep-alive request on the same client connection right after the
    spliced body works (the framing is intact), and so does a second
    spliced body on it (the upstream connection went back to the pool in
    step);
  - a response whose server closes mid-body (Content-Length 64 MiB, 8 MiB
    sent) ends the client's connection short instead of hanging, leaks no
    descriptor, and the data plane goes on serving;
  - a client that closes mid-body stops the splice with nothing leaked;
  - with OSR_SPLICE=0 the same download holds no pipe (the copy path) and is
    byte-exact too, so the pipe check can tell the two paths apart.
"""
import hashlib
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import test_dataplane as tdp  # noqa: E402  (Env, SID, the osrtest path)
import osrtest  # noqa: E402
import test_fdpass as tfp  # noqa: E402
from test_splice import check_pipes, pipes  # noqa: E402

BIG = tfp.BIG  # 64 MiB
SHORT_CL = 64 << 20
SHORT_SENT = 8 << 20


class Backend(tfp.Backend):
    """test_fdpass's backend (GET /big -> BIG, /small -> b"ok") plus
    /short: Content-Length 64 MiB, 8 MiB sent, then the connection closes."""

    def do_GET(self):
        if self.path != "/short":
            return super().do_GET()
        self.send_response(200)
        self.send_header("Content-Length", str(SHORT_CL))
        self.end_headers()
        self.wfile.write(BIG[:SHORT_SENT])
        self.wfile.flush()
        self.close_connection = True


class Reader:
    """An HTTP/1.1 client on one socket, reading responses in place."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.s.settimeout(60)
        self.buf = bytearray()

    def get(self, path, tok):
        self.s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nX-Access-Token: %s\r\n\r\n"
                        % (path, tok)).encode())

    def fill(self, n):
        """Read until n bytes are buffered; False on EOF first."""
        while len(self.buf) < n:
            d = self.s.recv(1 << 20)
            if not d:
                return False
            self.buf += d
        return True

    def head(self):
        while b"\r\n\r\n" not in self.buf:
            if not self.fill(len(self.buf) + 1):
                raise AssertionError("closed in the head: %r" % bytes(self.buf))
        i = self.buf.index(b"\r\n\r\n") + 4
        head = bytes(self.buf[:i]).decode("latin-1")
        del self.buf[:i]
        status = int(head.split()[1])
        cl = None
        for ln in head.split("\r\n")[1:]:
            k, _, v = ln.partition(":")
            if k.strip().lower() == "content-length":
                cl = int(v)
        return status, cl

    def body(self, n):
        ok = self.fill(n)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return ok, data

    def close(self):
        self.s.close()


class BodySplice(unittest.TestCase, tfp.BackendMixin):
    def setUp(self):
        self.start_backend(Backend)

    def tearDown(self):
        self.stop_backend()
        os.environ.pop("OSR_SPLICE", None)
        os.environ.pop("OSR_FDPASS", None)

    def wait_fds(self, pid, fds, why):
        """Up to 5 s for pid to hold at most fds descriptors again."""
        for _ in range(50):
            if osrtest.fd_count(pid) <= fds:
                break
            time.sleep(0.1)
        self.assertLessEqual(osrtest.fd_count(pid), fds, why)

    def big_path(self, name="big"):
        return "/sbx/%s/%d/%s" % (tdp.SID, self.bport, name)

    def slow_download(self, env, tok, splice):
        """The paused download on a fresh connection; returns the Reader
        (the connection stays open for what follows)."""
        pid = env.dp.p.pid
        # Warm the pool and the allocator first: the RSS check is about the
        # body, not the first connection's structures.
        r, data = env.request("GET", self.big_path("small"), {"X-Access-Token": tok})
        self.assertEqual((r.status, data), (200, b"ok"))
        base_pipes = pipes(pid)
        rss0 = osrtest.rss_kib(pid)
        c = Reader(env.port)
        c.get(self.big_path(), tok)
        status, cl = c.head()
        self.assertEqual((status, cl), (200, len(BIG)))
        self.assertTrue(c.fill(1 << 20), "closed early")
        check_pipes(self, pid, base_pipes, splice, "the body")
        time.sleep(0.5)  # let whatever would be read ahead pile up
        grew = osrtest.rss_kib(pid) - rss0
        self.assertLess(grew, 16 * 1024, "the data plane grew by %d KiB for a paused body" % grew)
        ok, data = c.body(len(BIG))
        self.assertTrue(ok, "closed after %d of %d bytes" % (len(data), len(BIG)))
        self.assertEqual(hashlib.sha256(data).digest(), hashlib.sha256(BIG).digest())
        if splice:
            self.assertEqual(pipes(pid) - base_pipes, 0, "the pipe outlived the body")
        return c

    def run_path(self, splice):
        if not splice:
            os.environ["OSR_SPLICE"] = "0"
        env = tdp.Env()
        try:
            pid = env.dp.p.pid
            tok = env.token(scopes="ports", ports=str(self.bport))
            c = self.slow_download(env, tok, splice)
            # Keep-alive on the same client connection after the body.
            c.get(self.big_path("small"), tok)
            self.assertEqual(c.head(), (200, 2))
            self.assertEqual(c.body(2), (True, b"ok"))
            # A second large body on it, read at full speed.
            c.get(self.big_path(), tok)
            self.assertEqual(c.head(), (200, len(BIG)))
            ok, data = c.body(len(BIG))
            self.assertTrue(ok)
            self.assertEqual(hashlib.sha256(data).digest(), hashlib.sha256(BIG).digest())
            c.close()
            # The server closes mid-body: the client's connection ends short.
            time.sleep(0.5)
            fds = osrtest.fd_count(pid)
            c = Reader(env.port)
            c.get(self.big_path("short"), tok)
            self.assertEqual(c.head(), (200, SHORT_CL))
            ok, data = c.body(SHORT_CL)
            self.assertFalse(ok, "a truncated body arrived whole")
            self.assertEqual(len(data), SHORT_SENT)
            self.assertEqual(data, BIG[:SHORT_SENT])
            c.close()
            self.wait_fds(pid, fds, "descriptors leaked")
            # The client goes away mid-body: the splice stops, nothing leaks.
            c = Reader(env.port)
            c.get(self.big_path(), tok)
            self.assertEqual(c.head(), (200, len(BIG)))
            self.assertTrue(c.fill(4 << 20))
            c.close()
            self.wait_fds(pid, fds, "descriptors leaked after the client left")
            r, data = env.request("GET", self.big_path("small"), {"X-Access-Token": tok})
            self.assertEqual((r.status, data), (200, b"ok"))
        finally:
            self.assertEqual(env.close(), 0)

    def test_passed_socket(self):
        self.run_path(True)

    def test_agent_tunnel(self):
        os.environ["OSR_FDPASS"] = "0"
        self.run_path(True)

    def test_splice_off(self):
        self.run_path(False)


if __name__ == "__main__":
    osrtest.run()
