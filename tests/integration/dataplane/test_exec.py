"""The data plane's exec console (docs/dataplane.md "Exec console"): the
Kubernetes channel protocol over WebSocket in front of the real osr-agent,
driven by real clients of that protocol: npm ws (exec_ws.mjs) and
@kubernetes/client-node's Exec (exec_k8s.mjs), which treats the data plane
as a kube-apiserver. Same setup as test_dataplane.py: osr-dataplane + an
open osr-agent on a unix socket, tokens from dp-mint, no gateway."""
import base64
import hashlib
import http.client
import json
import os
import subprocess
import sys
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "lib"))
sys.path.insert(0, os.path.dirname(__file__))
import osrtest  # noqa: E402
import test_dataplane as tdp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SID = tdp.SID


def q(command=None, **kw):
    parts = [("command", c) for c in (command or [])]
    for k, v in kw.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        parts.append((k, str(v)))
    return urllib.parse.urlencode(parts)


class Base(unittest.TestCase):
    def setUp(self):
        if not osrtest.have("node") or not os.path.isdir(os.path.join(osrtest.node_modules(), "ws")):
            self.skipTest("node and tests/node_modules (npm ci --prefix tests)")
        saved = os.environ.get("ASAN_OPTIONS")
        if self._testMethodName.startswith("test_slow_reader"):
            # Under ASan freed memory sits in a 256 MB quarantine, which
            # would read as growth (as in tests/integration/http2).
            os.environ["ASAN_OPTIONS"] = ((saved + ":") if saved else "") + \
                "quarantine_size_mb=4:thread_local_quarantine_size_kb=64"
        try:
            self.env = tdp.Env()
        finally:
            if saved is None:
                os.environ.pop("ASAN_OPTIONS", None)
            else:
                os.environ["ASAN_OPTIONS"] = saved

    def tearDown(self):
        rc = self.env.close()
        self.assertEqual(rc, 0, self.env.dp.stderr_text()[-3000:])

    def node(self, script, opts, timeout=180, stderr=None):
        envv = dict(os.environ, OSR_NODE_MODULES=osrtest.node_modules())
        cp = subprocess.run(["node", os.path.join(HERE, script), json.dumps(opts)], env=envv,
                            stdout=subprocess.PIPE, stderr=stderr or subprocess.PIPE, timeout=timeout)
        out = cp.stdout.decode().strip().split("\n")
        self.assertTrue(out, cp.stderr.decode() if cp.stderr else "no output")
        return json.loads(out[-1])

    def url(self, query, path=None, tok=None):
        e = self.env
        tok = tok if tok is not None else e.token()
        path = path or "/v1/sandboxes/%s/exec" % SID
        return "ws://127.0.0.1:%d%s?%s&access_token=%s" % (e.port, path, query, tok)

    def run_ws(self, query, timeout=180, **opts):
        opts.setdefault("url", self.url(query))
        return self.node("exec_ws.mjs", opts, timeout=timeout)

    def exit_code(self, st):
        self.assertIsNotNone(st, "no status message")
        if st["status"] == "Success":
            return 0
        self.assertEqual(st["reason"], "NonZeroExitCode", st)
        causes = st["details"]["causes"]
        self.assertEqual(causes[0]["reason"], "ExitCode")
        return int(causes[0]["message"])


class ExecWs(Base):
    def test_stdout_stderr_exit_code(self):
        r = self.run_ws(q(["sh", "-c", "printf out; printf err >&2; exit 3"]))
        self.assertEqual(r["protocol"], "v5.channel.k8s.io")
        self.assertEqual(r["stdoutText"], "out")
        self.assertEqual(r["stderrText"], "err")
        self.assertEqual(self.exit_code(r["status"]), 3)
        self.assertEqual(r["closeCode"], 1000)
        self.assertEqual(r["order"][-1], 3, "the status comes last")

    def test_exit_codes(self):
        for cmd, want in [("true", 0), ("exit 1", 1), ("exit 42", 42), ("kill -9 $$", 137),
                          ("kill -15 $$", 143)]:
            with self.subTest(cmd):
                r = self.run_ws(q(["sh", "-c", cmd]))
                self.assertEqual(self.exit_code(r["status"]), want, r)
                if want == 0:
                    self.assertEqual(r["status"], {"metadata": {}, "status": "Success"})

    def test_stdin_and_v5_close(self):
        data = bytes(range(256)) * 4000 + b"tail"  # 1 MB: several SendInput calls
        p = os.path.join(self.env.dir, "stdin.bin")
        with open(p, "wb") as f:
            f.write(data)
        r = self.run_ws(q(["cat"], stdin=True), stdinFile=p, closeStdin=True)
        self.assertEqual(r["stdoutLen"], len(data))
        self.assertEqual(r["stdoutSha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(self.exit_code(r["status"]), 0)

    def test_stdin_without_close_keeps_running(self):
        # Without the close channel cat never sees EOF: the client's stop
        # (stopAfter) ends the session, not the data plane.
        r = self.run_ws(q(["cat"], stdin=True), stdin=base64.b64encode(b"abc").decode(), stopAfter=3)
        self.assertEqual(r["stdoutText"], "abc")
        self.assertIsNone(r["status"])

    def test_v4(self):
        r = self.run_ws(q(["sh", "-c", "echo hi; exit 2"]), protocols=["v4.channel.k8s.io"])
        self.assertEqual(r["protocol"], "v4.channel.k8s.io")
        self.assertEqual(r["stdoutText"], "hi\n")
        self.assertEqual(self.exit_code(r["status"]), 2)

    def test_kubernetes_path_and_bearer(self):
        e = self.env
        url = "ws://127.0.0.1:%d/api/v1/namespaces/any/pods/%s/exec?%s" % (
            e.port, SID, q(["echo", "k8s path"]))
        r = self.node("exec_ws.mjs", {"url": url, "headers": {"Authorization": "Bearer " + e.token()}})
        self.assertEqual(r["stdoutText"], "k8s path\n")
        self.assertEqual(self.exit_code(r["status"]), 0)

    def test_binary_output(self):
        blob = bytes(range(256)) * 64
        p = os.path.join(self.env.dir, "bytes.bin")
        with open(p, "wb") as f:
            f.write(blob)
        r = self.run_ws(q(["cat", p]))
        self.assertEqual(r["stdoutLen"], len(blob))
        self.assertEqual(r["stdoutSha256"], hashlib.sha256(blob).hexdigest())

    def test_large_output_exact(self):
        n = 50 * 1000 * 1000
        p = os.path.join(self.env.dir, "big.bin")
        with open(p, "wb") as f:
            f.write(osrtest.pattern(n, seed=5))
        with open(p, "rb") as f:
            want = hashlib.sha256(f.read()).hexdigest()
        r = self.run_ws(q(["cat", p]), timeout=300)
        self.assertEqual(r["stdoutLen"], n)
        self.assertEqual(r["stdoutSha256"], want)
        self.assertEqual(self.exit_code(r["status"]), 0)

    def test_slow_reader_bounded_memory(self):
        # 200 MB of output to a client that stops reading for 6 s: the data
        # plane must hold the agent stream (which stops the process), not
        # buffer the output. Its RSS may not grow by more than 48 MiB.
        n = 200 * 1000 * 1000
        e = self.env
        base = e.dp.rss_kib()
        envv = dict(os.environ, OSR_NODE_MODULES=osrtest.node_modules())
        opts = {"url": self.url(q(["head", "-c", str(n), "/dev/zero"])), "pauseMs": 6000}
        p = subprocess.Popen(["node", os.path.join(HERE, "exec_ws.mjs"), json.dumps(opts)], env=envv,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        peak = base
        deadline = time.time() + 300
        while p.poll() is None and time.time() < deadline:
            peak = max(peak, e.dp.rss_kib())
            time.sleep(0.1)
        out, err = p.communicate(timeout=300)
        self.assertIn(b"paused", err)
        r = json.loads(out.decode().strip().split("\n")[-1])
        self.assertEqual(r["stdoutLen"], n)
        self.assertEqual(self.exit_code(r["status"]), 0)
        self.assertLess(peak - base, 48 * 1024, "data plane RSS grew %d KiB" % (peak - base))

    def test_tty_resize(self):
        # The resize goes out before the input, so `stty size` runs on the
        # resized terminal; both are case-insensitive JSON keys.
        r = self.run_ws(q(["sh", "-c", "read x; stty size"], stdin=True, tty=True),
                        resize=[{"Width": 101, "Height": 33}], stdin=base64.b64encode(b"go\n").decode())
        self.assertIn("33 101", r["stdoutText"])
        self.assertEqual(r["stderrText"], "")
        self.assertEqual(self.exit_code(r["status"]), 0)

    def test_reconnect_from_offset(self):
        # A process writing 60 numbered lines; the first client leaves after
        # 50 bytes, a second re-attaches by pid from exactly where it left.
        script = "for i in $(seq 1 60); do echo line$i; sleep 0.02; done"
        want = "".join("line%d\n" % i for i in range(1, 61))
        r1 = self.run_ws(q(["sh", "-c", script], osrInfo=True, tag="job1"), stopAfter=50)
        self.assertIsNotNone(r1["info"], r1)
        self.assertEqual(r1["order"][0], "info")
        pid = r1["info"]["pid"]
        got = r1["stdoutText"]
        self.assertGreaterEqual(len(got), 50)
        self.assertTrue(want.startswith(got))
        r2 = self.run_ws(q(pid=pid, offset=len(got), osrInfo=True))
        self.assertEqual(r2["info"], {"pid": pid, "outputOffset": str(len(got))})
        self.assertEqual(got + r2["stdoutText"], want)
        self.assertEqual(self.exit_code(r2["status"]), 0)
        # By tag, from 0, after the exit: the whole output again.
        r3 = self.run_ws(q(tag="job1", offset=0))
        self.assertEqual(r3["stdoutText"], want)
        self.assertEqual(self.exit_code(r3["status"]), 0)
        # An offset beyond what was produced: a Failure status, no output.
        r4 = self.run_ws(q(pid=pid, offset=10 ** 9))
        self.assertEqual(r4["status"]["status"], "Failure")
        self.assertEqual(r4["status"]["reason"], "BadRequest")
        self.assertEqual(r4["stdoutLen"], 0)
        r5 = self.run_ws(q(pid=999999))
        self.assertEqual(r5["status"]["reason"], "NotFound", r5)

    def test_start_failure_is_a_status(self):
        r = self.run_ws(q(["/nonexistent/binary"]))
        self.assertEqual(r["status"]["status"], "Failure")
        self.assertEqual(r["closeCode"], 1000)


class ExecAuth(Base):
    def upgrade(self, path, headers=None):
        e = self.env
        c = http.client.HTTPConnection("127.0.0.1", e.port, timeout=30)
        h = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
             "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
             "Sec-WebSocket-Protocol": "v5.channel.k8s.io"}
        h.update(headers or {})
        c.request("GET", path, headers=h)
        r = c.getresponse()
        body = r.read() if r.status != 101 else b""
        c.close()
        return r.status, body

    def test_refusals_reach_nothing(self):
        e = self.env
        ep = "unix:" + e.sentinel.path
        cmd = q(["echo", "x"])
        path = "/v1/sandboxes/%s/exec?%s" % (SID, cmd)
        cases = [
            ("no token", None, 401),
            ("garbage", "nope", 401),
            ("expired", e.token(ttl=-60, ep=ep), 401),
            ("unknown kid", e.token(kid="k9", keys=e.other_keys, ep=ep), 401),
            ("wrong sandbox", e.token(sid="sbx2", ep=ep), 403),
            ("files scope", e.token(scopes="files", ep=ep), 403),
            ("ports scope", e.token(scopes="ports", ep=ep), 403),
        ]
        for name, tok, want in cases:
            for how in ("query", "bearer", "header"):
                with self.subTest(name=name, how=how):
                    p, h = path, {}
                    if tok is not None and how == "query":
                        p += "&access_token=" + tok
                    elif tok is not None and how == "bearer":
                        h["Authorization"] = "Bearer " + tok
                    elif tok is not None:
                        h["X-Access-Token"] = tok
                    st, body = self.upgrade(p, h)
                    self.assertEqual(st, want, body)
                    json.loads(body)
        # Bad queries are refused before anything is sent as well.
        good = e.token(ep=ep)
        for query, why in [("", "command is required"), ("command=x&stdin=maybe", "stdin"),
                           ("command=x&offset=5", "offset"),
                           ("command=x&stdin=false&stdout=false&stderr=false", "at least one")]:
            with self.subTest(query=query):
                st, body = self.upgrade("/v1/sandboxes/%s/exec?%s&access_token=%s" % (SID, query, good))
                self.assertEqual(st, 400, body)
                self.assertIn(why, json.loads(body)["message"])
        # No WebSocket: 400.
        r, body = e.request("GET", "/v1/sandboxes/%s/exec?%s&access_token=%s" % (SID, cmd, good))
        self.assertEqual(r.status, 400, body)
        time.sleep(0.3)
        self.assertEqual(e.sentinel.count, 0, "a refused exec reached the agent")
        # The control: a valid token with that endpoint does reach it (the
        # sentinel hangs up, so the session ends with a Failure status).
        r = self.run_ws(cmd, url=self.url(cmd, tok=good))
        self.assertEqual(r["status"]["status"], "Failure", r)
        deadline = time.time() + 5
        while e.sentinel.count == 0 and time.time() < deadline:
            time.sleep(0.05)
        self.assertGreater(e.sentinel.count, 0)


class ExecK8sClient(Base):
    def setUp(self):
        super().setUp()
        if not os.path.isdir(os.path.join(osrtest.node_modules(), "@kubernetes", "client-node")):
            self.skipTest("@kubernetes/client-node not installed (npm ci --prefix tests)")

    def k8s(self, **o):
        e = self.env
        o.setdefault("server", "http://127.0.0.1:%d" % e.port)
        o.setdefault("token", e.token())
        o.setdefault("pod", SID)
        return self.node("exec_k8s.mjs", o)

    def test_exec_exit_code(self):
        r = self.k8s(command=["sh", "-c", "echo hello; echo oops >&2; exit 7"])
        self.assertIsNone(r["error"], r)
        self.assertEqual(r["stdout"], "hello\n")
        self.assertEqual(r["stderr"], "oops\n")
        self.assertEqual(r["status"]["status"], "Failure")
        self.assertEqual(r["status"]["details"]["causes"][0], {"reason": "ExitCode", "message": "7"})

    def test_exec_stdin_close(self):
        # client-node ends stdin with the v5 close channel; cat then exits.
        r = self.k8s(command=["sh", "-c", "cat; echo done"], stdin="from client-node\n")
        self.assertIsNone(r["error"], r)
        self.assertEqual(r["stdout"], "from client-node\ndone\n")
        self.assertEqual(r["status"], {"metadata": {}, "status": "Success"})

    def test_exec_tty_resize(self):
        # client-node sends {"height","width"} from stdout.rows/columns.
        r = self.k8s(command=["sh", "-c", "read x; stty size"], stdin="go\n", tty=True, rows=41,
                     cols=123)
        self.assertIsNone(r["error"], r)
        self.assertIn("41 123", r["stdout"])
        self.assertEqual(r["status"]["status"], "Success")

    def test_wrong_token(self):
        r = self.k8s(command=["true"], token=self.env.token(scopes="files"))
        self.assertIsNotNone(r["error"])
        self.assertIsNone(r["status"])


class ExecHttpStream(Base):
    """POST .../exec: input frames as the request body, output frames as the
    response body, over HTTP/2 (h2c) and HTTP/1.1 chunked, from node's own
    http2 / http clients (exec_h2.mjs)."""

    def h2(self, query, proto="h2", tok=None, **o):
        e = self.env
        o.update(port=e.port, path="/v1/sandboxes/%s/exec?%s" % (SID, query), proto=proto,
                 token=tok if tok is not None else e.token())
        return self.node("exec_h2.mjs", o)

    def test_output_and_exit_code(self):
        for proto in ("h2", "h1"):
            with self.subTest(proto):
                r = self.h2(q(["sh", "-c", "printf out; printf err >&2; exit 5"]), proto=proto,
                            endBody=True)
                self.assertEqual(r["httpStatus"], 200, r)
                self.assertEqual(r["contentType"], "application/vnd.osr.exec-frames")
                self.assertEqual(r["stdoutText"], "out")
                self.assertEqual(r["stderrText"], "err")
                self.assertEqual(self.exit_code(r["status"]), 5)
                self.assertEqual(r["order"][-1], 3)
                self.assertNotIn("trailing", r)

    def test_stdin_bidirectional(self):
        # cat echoes while the body is still being sent; the end of the
        # request body (or a close frame) closes its stdin.
        data = bytes(range(256)) * 4000
        p = os.path.join(self.env.dir, "in.bin")
        with open(p, "wb") as f:
            f.write(data)
        for proto, how in (("h2", "endBody"), ("h2", "closeFrame"), ("h1", "endBody")):
            with self.subTest(proto=proto, how=how):
                r = self.h2(q(["cat"], stdin=True), proto=proto, stdinFile=p, **{how: True})
                self.assertEqual(r["stdoutLen"], len(data), r)
                self.assertEqual(r["stdoutSha256"], hashlib.sha256(data).hexdigest())
                self.assertEqual(self.exit_code(r["status"]), 0)

    def test_tty_resize_and_info(self):
        p = os.path.join(self.env.dir, "go.txt")
        with open(p, "wb") as f:
            f.write(b"go\n")
        r = self.h2(q(["sh", "-c", "read x; stty size"], stdin=True, tty=True, osrInfo=True),
                    resize=[{"Width": 77, "Height": 22}], stdinFile=p)
        self.assertIn("22 77", r["stdoutText"])
        self.assertIsInstance(r["info"]["pid"], int)
        self.assertEqual(self.exit_code(r["status"]), 0)

    def test_large_output(self):
        n = 50 * 1000 * 1000
        p = os.path.join(self.env.dir, "big.bin")
        with open(p, "wb") as f:
            f.write(osrtest.pattern(n, seed=9))
        with open(p, "rb") as f:
            want = hashlib.sha256(f.read()).hexdigest()
        r = self.h2(q(["cat", p]), endBody=True)
        self.assertEqual(r["stdoutLen"], n)
        self.assertEqual(r["stdoutSha256"], want)
        self.assertEqual(self.exit_code(r["status"]), 0)

    def test_slow_reader_bounded_memory(self):
        # As ExecWs's: 200 MB to an HTTP/2 client that stops reading for 6 s.
        n = 200 * 1000 * 1000
        e = self.env
        base = e.dp.rss_kib()
        envv = dict(os.environ, OSR_NODE_MODULES=osrtest.node_modules())
        opts = {"port": e.port, "proto": "h2", "token": e.token(), "endBody": True, "pauseMs": 6000,
                "path": "/v1/sandboxes/%s/exec?%s" % (SID, q(["head", "-c", str(n), "/dev/zero"]))}
        p = subprocess.Popen(["node", os.path.join(HERE, "exec_h2.mjs"), json.dumps(opts)], env=envv,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        peak = base
        deadline = time.time() + 300
        while p.poll() is None and time.time() < deadline:
            peak = max(peak, e.dp.rss_kib())
            time.sleep(0.1)
        out, err = p.communicate(timeout=300)
        self.assertIn(b"paused", err)
        r = json.loads(out.decode().strip().split("\n")[-1])
        self.assertEqual(r["stdoutLen"], n)
        self.assertEqual(self.exit_code(r["status"]), 0)
        self.assertLess(peak - base, 48 * 1024, "data plane RSS grew %d KiB" % (peak - base))

    def test_h1_head_before_input(self):
        # A client that waits for the response head before it sends input to
        # a process that prints nothing until it reads some (cat): the head
        # must come first, without any output to carry it.
        import socket
        e = self.env
        s = socket.create_connection(("127.0.0.1", e.port), timeout=30)
        try:
            path = "/v1/sandboxes/%s/exec?%s" % (SID, q(["cat"], stdin=True))
            s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nX-Access-Token: %s\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n" % (path, e.token())).encode())
            got = b""
            while b"\r\n\r\n" not in got:
                b = s.recv(65536)  # times out (30 s) if the head never comes
                self.assertTrue(b, "connection closed before the head")
                got += b
            head, rest = got.split(b"\r\n\r\n", 1)
            self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
            self.assertIn(b"application/vnd.osr.exec-frames", head.lower())
            frame = b"\x00" + b"ping\n"
            body = len(frame).to_bytes(4, "big") + frame
            s.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            while b"0\r\n\r\n" not in rest:
                b = s.recv(65536)
                if not b:
                    break
                rest += b
        finally:
            s.close()
        # Undo the chunked framing, then split the output frames.
        data, i = b"", 0
        while True:
            j = rest.index(b"\r\n", i)
            n = int(rest[i:j], 16)
            if n == 0:
                break
            data += rest[j + 2:j + 2 + n]
            i = j + 4 + n
        frames, k = [], 0
        while k < len(data):
            n = int.from_bytes(data[k:k + 4], "big")
            frames.append((data[k + 4], data[k + 5:k + 4 + n]))
            k += 4 + n
        self.assertIn((1, b"ping\n"), frames)
        self.assertEqual(frames[-1][0], 3)
        self.assertEqual(self.exit_code(json.loads(frames[-1][1])), 0)

    def test_refused(self):
        r = self.h2(q(["true"]), tok=self.env.token(scopes="files"), endBody=True)
        self.assertEqual(r["httpStatus"], 403)


class ExecStop(Base):
    def test_stop_with_live_sessions(self):
        """Stopping the data plane ends live sessions (a Failure status, then
        the close / the end of the body) instead of waiting for them, and it
        exits cleanly (tearDown checks the exit code)."""
        e = self.env
        envv = dict(os.environ, OSR_NODE_MODULES=osrtest.node_modules())
        ws = osrtest.Proc(["node", os.path.join(HERE, "exec_ws.mjs"), json.dumps(
            {"url": self.url(q(["sleep", "100"], osrInfo=True))})], env=envv)
        h2 = osrtest.Proc(["node", os.path.join(HERE, "exec_h2.mjs"), json.dumps(
            {"port": e.port, "proto": "h2", "token": e.token(),
             "path": "/v1/sandboxes/%s/exec?%s" % (SID, q(["sleep", "100"], osrInfo=True))})],
            env=envv)
        ws.wait_line("info ", timeout=30)
        h2.wait_line("info ", timeout=30)
        t0 = time.time()
        rc = e.dp.stop()
        self.assertEqual(rc, 0, e.dp.stderr_text()[-3000:])
        # Well inside the 5 s grace period: the sessions did not wait for it.
        self.assertLess(time.time() - t0, 4.5)
        for c in (ws, h2):
            self.assertEqual(c.p.wait(timeout=30), 0)
            self.assertEqual(c.stop(), 0)  # joins its output threads
            r = json.loads(c.lines[-1])
            self.assertIsNotNone(r["status"], (r, e.dp.stderr_text()[-3000:]))
            self.assertEqual(r["status"]["reason"], "ServiceUnavailable", r)
            self.assertNotIn("error", r)
        self.assertEqual(json.loads(ws.lines[-1])["closeCode"], 1000)


if __name__ == "__main__":
    osrtest.run()
