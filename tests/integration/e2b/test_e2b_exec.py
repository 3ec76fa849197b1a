"""The real e2b SDK end to end: `osr serve` with the local provider and its
embedded data plane; the SDK's control-plane calls go to the gateway
(E2B_API_URL) and its envd calls (commands, files) through the data plane
(E2B_SANDBOX_URL) to osr-agent inside a real sandbox (e2b_exec.js)."""
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "local"))
import osrtest  # noqa: E402
from test_local import runtime_problem  # noqa: E402

CLI = os.environ.get("OSR_CLI", "")
ADMIN = "osr-admin-e2b-exec-test-0123456789abcd"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class SdkExec(unittest.TestCase):
    def test_commands_and_files_through_the_data_plane(self):
        if os.geteuid() != 0:
            self.skipTest("the local provider needs root")
        classes = [c for c in ("container", "gvisor") if runtime_problem(c) is None]
        if not classes:
            self.skipTest("the local provider's probe fails here")
        if not os.path.isdir(os.path.join(osrtest.node_modules(), "e2b")):
            self.fail("npm e2b is not installed: run npm ci --prefix tests")
        d = tempfile.mkdtemp(prefix="osr-e2b-exec-")
        dp_port = free_port()
        env = {"OSR_DATA_DIR": d, "OSR_PROVIDERS": "local", "OSR_ADMIN_KEY": ADMIN}
        for k in ("OSR_LISTEN", "OSR_STORE", "OSR_REDIS", "OSR_CONFIG", "OSR_DATAPLANE_LISTEN"):
            os.environ.pop(k, None)
        proc = osrtest.Proc([CLI, "serve", "--listen", "127.0.0.1:0", "--dataplane-listen",
                             "127.0.0.1:%d" % dp_port], env=env)
        try:
            port = None
            for _ in range(1200):
                m = re.search(r"listening on \S+ \(port (\d+)", proc.stderr_text())
                if m and "data plane serving" in proc.stderr_text():
                    port = int(m.group(1))
                    break
                if not proc.alive():
                    break
                time.sleep(0.05)
            self.assertIsNotNone(port, proc.stderr_text())
            req = urllib.request.Request(
                "http://127.0.0.1:%d/v1/keys" % port,
                data=json.dumps({"tenant": "e2b-exec", "format": "e2b"}).encode(), method="POST",
                headers={"Authorization": "Bearer " + ADMIN, "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                key = json.loads(r.read())["key"]
            env = {"E2B_API_URL": "http://127.0.0.1:%d" % port,
                   "E2B_SANDBOX_URL": "http://127.0.0.1:%d" % dp_port, "E2B_API_KEY": key,
                   "NODE_PATH": osrtest.node_modules()}
            cp = osrtest.sh(["node", os.path.join(HERE, "e2b_exec.js")], env=env, timeout=240,
                            check=False)
            out = cp.stdout.decode("utf-8", "replace")
            err = cp.stderr.decode("utf-8", "replace")
            self.assertEqual(cp.returncode, 0, out + err + "\nosr serve:\n" + proc.stderr_text()[-4000:])
            self.assertIn("E2B-EXEC-OK", out)
        finally:
            rc = proc.stop()
            shutil.rmtree(d, ignore_errors=True)
        self.assertEqual(rc, 0, proc.stderr_text()[-4000:])


if __name__ == "__main__":
    osrtest.run()
