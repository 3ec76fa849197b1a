"""The exec console through `osr serve`'s embedded data plane to a real
sandbox of the local provider (bwrap/runsc): the agent there checks its
derived agent token, so output, stdin (SendInput, CloseStdin on the
control connection) and the exit status arriving prove the exec session
carries that token on both of its agent connections."""
import base64
import json
import os
import subprocess
import sys
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "lib"))
sys.path.insert(0, HERE)
import osrtest  # noqa: E402
import test_embed  # noqa: E402


class ExecEmbedded(test_embed.Embedded):
    test_exec_through_embedded_dataplane = None  # test_embed's own test, not run twice

    def ws(self, sid, tok, query, **o):
        o["url"] = "ws://127.0.0.1:%d/v1/sandboxes/%s/exec?%s" % (self.dp_port, sid, query)
        o["headers"] = {"Authorization": "Bearer " + tok}
        envv = dict(os.environ, OSR_NODE_MODULES=osrtest.node_modules())
        cp = subprocess.run(["node", os.path.join(HERE, "exec_ws.mjs"), json.dumps(o)], env=envv,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        out = cp.stdout.decode().strip().split("\n")
        self.assertTrue(out[-1], cp.stderr.decode())
        return json.loads(out[-1])

    def test_exec_console_in_a_sandbox(self):
        if not osrtest.have("node") or not os.path.isdir(os.path.join(osrtest.node_modules(), "ws")):
            self.skipTest("node and tests/node_modules")
        self.start()
        st, b = self.api("POST", "/v1/sandboxes", {"capabilities": {"isolation": self.cls},
                                                   "timeoutSeconds": 600})
        self.assertEqual(st, 201, b)
        sid = b["id"]
        self.created.append(sid)
        tok = b["token"]
        q = urllib.parse.urlencode([("command", "sh"), ("command", "-c"),
                                    ("command", "echo in-sandbox; cat; exit 4"), ("stdin", "true")])
        r = self.ws(sid, tok, q, stdin=base64.b64encode(b"typed\n").decode(), closeStdin=True)
        self.assertEqual(r["protocol"], "v5.channel.k8s.io", r)
        self.assertEqual(r["stdoutText"], "in-sandbox\ntyped\n")
        self.assertEqual(r["status"]["details"]["causes"][0], {"reason": "ExitCode", "message": "4"})
        # A terminal, resized.
        q = urllib.parse.urlencode([("command", "sh"), ("command", "-c"),
                                    ("command", "read x; stty size"), ("stdin", "true"),
                                    ("tty", "true")])
        r = self.ws(sid, tok, q, resize=[{"Width": 90, "Height": 20}],
                    stdin=base64.b64encode(b"go\n").decode())
        self.assertIn("20 90", r["stdoutText"], r)
        self.assertEqual(r["status"]["status"], "Success")


if __name__ == "__main__":
    osrtest.run()
