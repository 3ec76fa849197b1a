"""The real e2b JS SDK (npm e2b, pinned in tests/package.json) against
osr-agent.

The SDK needs a control plane to create a sandbox; here that is a FAKE: a
few lines of python http.server that answer POST /v2/sandboxes (and the
<= 2.50 POST /sandboxes) with a sandbox record whose envd token is the
agent's, and DELETE /sandboxes/{id}. E2B_SANDBOX_URL points all envd
traffic at osr-agent's TCP listener (the agent ignores the E2b-Sandbox-Id
and E2b-Sandbox-Port headers). Everything envd-side is the real agent.
"""
import json
import os
import shutil
import sys
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(__file__))
from agentlib import Agent  # noqa: E402
import osrtest  # noqa: E402


class FakeControlPlane(BaseHTTPRequestHandler):
    """A fake E2B API: just enough for Sandbox.create() and kill()."""
    protocol_version = "HTTP/1.1"
    token = None
    calls = []

    def log_message(self, *a):
        pass

    def _body(self):
        # The SDK sends chunked JSON bodies (contract §2).
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                n = int(self.rfile.readline().strip() or b"0", 16)
                if n == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(n)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n)

    def _send(self, code, obj=None):
        body = json.dumps(obj).encode() if obj is not None else b""
        self.send_response(code)
        if obj is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self._body()
        FakeControlPlane.calls.append(("POST", self.path, body))
        if self.path in ("/sandboxes", "/v2/sandboxes"):
            self._send(201, {"sandboxID": "fake-sbx-1", "templateID": "base", "clientID": "fake",
                             "envdVersion": "0.5.7", "envdAccessToken": FakeControlPlane.token,
                             "domain": None})
        else:
            self._send(404, {"code": 404, "message": "not found"})

    def do_DELETE(self):
        FakeControlPlane.calls.append(("DELETE", self.path, b""))
        if self.path == "/sandboxes/fake-sbx-1":
            self._send(204)
        else:
            self._send(404, {"code": 404, "message": "not found"})


class Sdk(unittest.TestCase):
    def test_sdk(self):
        nm = osrtest.node_modules()
        if not os.path.isdir(os.path.join(nm, "e2b")):
            self.fail("npm e2b is not installed: run npm ci --prefix tests")
        with Agent() as agent:
            FakeControlPlane.token = agent.token
            srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeControlPlane)
            t = threading.Thread(target=srv.serve_forever, daemon=True)
            t.start()
            d = tempfile.mkdtemp(prefix="osr-agent-sdk-")
            try:
                env = {
                    "E2B_API_KEY": "e2b_0123456789abcdef",
                    "E2B_API_URL": "http://127.0.0.1:%d" % srv.server_address[1],
                    "E2B_SANDBOX_URL": "http://127.0.0.1:%d" % agent.port,
                    "OSR_SDK_DIR": d,
                }
                cp = osrtest.sh(["node", os.path.join(os.path.dirname(__file__), "e2b_sdk.js")],
                                env=env, timeout=180, check=False)
                out = cp.stdout.decode("utf-8", "replace")
                self.assertEqual(cp.returncode, 0, out + cp.stderr.decode("utf-8", "replace")
                                 + "\nagent:\n" + agent.proc.stderr_text()[-3000:])
                self.assertIn("SDK-OK", out)
                methods = [(m, p) for m, p, _ in FakeControlPlane.calls]
                self.assertIn(("DELETE", "/sandboxes/fake-sbx-1"), methods)
            finally:
                srv.shutdown()
                srv.server_close()
                shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    osrtest.run()
