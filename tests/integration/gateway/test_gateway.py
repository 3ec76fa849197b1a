"""osr serve / osr-gateway: flags, health endpoints over HTTP/1.1, HTTP/2 and
TLS (driven by curl), unix sockets, graceful drain. Every run gets its own
data directory (SQLite store, admin.key) so nothing lands in $HOME."""
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

import osrtest

GATEWAY = os.environ.get("OSR_GATEWAY", "")
CLI = os.environ.get("OSR_CLI", "")


DATA_DIRS = []


def data_env():
    d = tempfile.mkdtemp(prefix="osr-gw-")
    DATA_DIRS.append(d)
    for k in ("OSR_LISTEN", "OSR_STORE", "OSR_REDIS", "OSR_PROVIDERS", "OSR_CONFIG", "OSR_ADMIN_KEY"):
        os.environ.pop(k, None)
    # sim: the embedded default would be the local provider (real sandboxes).
    return {"OSR_DATA_DIR": d, "OSR_PROVIDERS": "sim"}


def start(*args, exe=None):
    # `osr serve` embeds the data plane: port 0, never two servers on 7071.
    argv = [exe or CLI] + (["serve", "--dataplane-listen", "127.0.0.1:0"] if exe is None else []) + list(args)
    p = osrtest.Proc(argv, env=data_env())
    return p


def port_of(p):
    end = time.time() + 15
    while time.time() < end:
        m = re.search(r"listening on \S+ \(port (\d+)", p.stderr_text())
        if m:
            return int(m.group(1))
        if not p.alive():
            raise AssertionError("gateway exited:\n" + p.stderr_text())
        time.sleep(0.05)
    raise AssertionError("gateway did not report its port:\n" + p.stderr_text())


def curl(*args):
    cp = osrtest.sh(["curl", "-sS", "--max-time", "10", "-w", "\n%{http_code} %{http_version}"] + list(args))
    body, _, tail = cp.stdout.decode().rpartition("\n")
    code, ver = tail.split()
    return int(code), ver, body


class Flags(unittest.TestCase):
    def test_help_and_version(self):
        for argv in ([CLI, "serve", "--help"], [GATEWAY, "--help"]):
            cp = osrtest.sh(argv)
            out = cp.stdout.decode()
            for flag in ("--listen", "--tls-cert", "--tls-key", "--drain-ms", "--log-level", "--log-json",
                         "--store", "--data-dir"):
                self.assertIn(flag, out)
            self.assertIn("127.0.0.1:7070", out)
        self.assertIn("osr 0.", osrtest.sh([CLI, "version"]).stdout.decode())

    def test_default_listen_is_7070(self):
        import socket
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 7070))
        except OSError:
            self.skipTest("127.0.0.1:7070 is in use on this machine")
        finally:
            s.close()
        p = start()
        try:
            self.assertEqual(port_of(p), 7070)
            self.assertIn("listening on 127.0.0.1:7070 (port 7070, http)", p.stderr_text())
            code, _, body = curl("http://127.0.0.1:7070/healthz")
            self.assertEqual(code, 200)
        finally:
            self.assertEqual(p.stop(), 0)

    def test_bad_flags_exit_2_with_message(self):
        for args, msg in ((["--bogus"], "--bogus: unknown option"), (["--listen"], "--listen: needs a value"),
                          (["--tls-cert", "x"], "go together"), (["--log-level", "loud"], "'loud' is not one of"),
                          (["--drain-ms", "soon"], "--drain-ms")):
            cp = osrtest.sh([CLI, "serve"] + args, check=False, env=data_env())
            self.assertEqual(cp.returncode, 2, args)
            self.assertIn(msg, cp.stderr.decode(), args)
        cp = osrtest.sh([CLI, "frobnicate"], check=False)
        self.assertEqual(cp.returncode, 2)

    def test_bad_listen_address_fails_cleanly(self):
        cp = osrtest.sh([CLI, "serve", "--listen", "not-an-address"], check=False, timeout=10, env=data_env())
        self.assertEqual(cp.returncode, 1)
        self.assertIn("listen not-an-address", cp.stderr.decode())


class Health(unittest.TestCase):
    def test_health_http1_http2_and_errors(self):
        p = start("--listen", "127.0.0.1:0", "--log-json")
        try:
            port = port_of(p)
            code, ver, body = curl("http://127.0.0.1:%d/healthz" % port)
            self.assertEqual((code, ver), (200, "1.1"))
            j = json.loads(body)
            self.assertEqual(j["status"], "ok")
            self.assertEqual(j["tls"], osrtest.TLS_BACKEND)
            code, ver, body = curl("--http2-prior-knowledge", "http://127.0.0.1:%d/readyz" % port)
            self.assertEqual((code, ver), (200, "2"))
            code, _, body = curl("http://127.0.0.1:%d/nope" % port)
            self.assertEqual(code, 404)
            self.assertEqual(json.loads(body)["error"]["code"], "not_found")
            code, _, body = curl("-X", "POST", "http://127.0.0.1:%d/healthz" % port)
            self.assertEqual(code, 405)
            # --log-json: every log line is a JSON object.
            lines = [ln for ln in p.stderr_text().splitlines() if ln.strip()]
            self.assertTrue(lines)
            for ln in lines:
                self.assertIn(json.loads(ln)["level"], ("info", "warn", "error", "debug"))
        finally:
            self.assertEqual(p.stop(), 0)

    def test_unix_socket_and_ipv6(self):
        d = tempfile.mkdtemp()
        sock = os.path.join(d, "gw.sock")
        p = start("--listen", "unix:" + sock, "--listen", "[::1]:0")
        try:
            end = time.time() + 10
            while not os.path.exists(sock) and time.time() < end:
                time.sleep(0.05)
            code, _, body = curl("--unix-socket", sock, "http://localhost/healthz")
            self.assertEqual(code, 200)
            self.assertEqual(oct(os.stat(sock).st_mode & 0o777), "0o600")
            m = re.search(r"listening on \[::1\]:0 \(port (\d+)", p.stderr_text())
            self.assertIsNotNone(m, p.stderr_text())
            code, _, _ = curl("http://[::1]:%s/healthz" % m.group(1))
            self.assertEqual(code, 200)
        finally:
            self.assertEqual(p.stop(), 0)
        self.assertFalse(os.path.exists(sock))

    def test_tls_h2_and_http11(self):
        certs = osrtest.Certs()
        p = start("--listen", "127.0.0.1:0", "--tls-cert", certs.cert, "--tls-key", certs.key)
        try:
            port = port_of(p)
            code, ver, body = curl("--cacert", certs.ca, "https://localhost:%d/healthz" % port)
            self.assertEqual((code, ver), (200, "2"))
            code, ver, body = curl("--http1.1", "--cacert", certs.ca, "https://localhost:%d/healthz" % port)
            self.assertEqual((code, ver), (200, "1.1"))
        finally:
            self.assertEqual(p.stop(), 0)
            certs.cleanup()

    def test_missing_cert_fails_at_start(self):
        cp = osrtest.sh([CLI, "serve", "--listen", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem",
                         "--tls-key", "/nonexistent.key"], check=False, timeout=10, env=data_env())
        self.assertEqual(cp.returncode, 1)
        self.assertIn("TLS certificate/key", cp.stderr.decode())


class Drain(unittest.TestCase):
    def test_sigterm_drains_and_exits_zero(self):
        p = start("--listen", "127.0.0.1:0", "--drain-ms", "60000", exe=GATEWAY)
        port = port_of(p)
        # An idle keep-alive connection must not hold the drain up.
        import socket
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b"200", s.recv(4096))
        t0 = time.time()
        rc = p.stop(signal.SIGTERM)
        self.assertEqual(rc, 0)
        # Idle connections close at once: far under the 60 s grace period.
        self.assertLess(time.time() - t0, 30)
        self.assertIn("drained", p.stderr_text())
        s.close()


def cleanup():
    import shutil
    for d in DATA_DIRS:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    import atexit
    atexit.register(cleanup)
    osrtest.run()
