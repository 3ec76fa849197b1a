"""The real e2b SDK end to end: `osr serve` with the local provider and its
embedded data plane; the SDK's control-plane calls go to the gateway
(E2B_API_URL) and its envd calls (commands, files, pty) and in-sandbox ports
(getHost) through the data plane (E2B_SANDBOX_URL) to osr-agent inside a
real sandbox of each isolation class (e2b_exec.js)."""
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
import osrtest  # noqa: E402

CLI = os.environ.get("OSR_CLI", "")
ADMIN = "osr-admin-e2b-exec-test-0123456789abcd"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class SdkExecBase:
    """The scenario of e2b_exec.js on one isolation class (CLASS): the class
    is forced with the OSR extra header X-OSR-Capabilities {"isolation": ...}
    (a floor: placement picks the cheapest class at or above it, so the
    local provider's container class for "container") and checked on OSR's
    own API. `osr serve` gets e2b.domain from its YAML file, so the create
    answer's domain makes getHost(port) = <port>-<id>.sbx.osr.test:<dp port>,
    which the embedded data plane routes (Host form)."""
    CLASS = None
    BINARY = None

    def test_sdk_end_to_end(self):
        if os.geteuid() != 0:
            self.skipTest("the local provider needs root")
        # Only a host without the runtime may skip: when the binary is there
        # and does not work, creating the sandbox fails and so does the test.
        if shutil.which(self.BINARY) is None:
            self.skipTest("%s is not installed" % self.BINARY)
        if not os.path.isdir(os.path.join(osrtest.node_modules(), "e2b")):
            self.fail("npm e2b is not installed: run npm ci --prefix tests")
        d = tempfile.mkdtemp(prefix="osr-e2b-exec-")
        dp_port = free_port()
        domain = "sbx.osr.test:%d" % dp_port
        cfg = os.path.join(d, "osr.yaml")
        with open(cfg, "w") as f:
            f.write("e2b:\n  domain: %s\n" % domain)
        env = {"OSR_DATA_DIR": d, "OSR_PROVIDERS": "local", "OSR_ADMIN_KEY": ADMIN}
        for k in ("OSR_LISTEN", "OSR_STORE", "OSR_REDIS", "OSR_CONFIG", "OSR_DATAPLANE_LISTEN",
                  "OSR_E2B_DOMAIN"):
            os.environ.pop(k, None)
        proc = osrtest.Proc([CLI, "serve", "--listen", "127.0.0.1:0", "--dataplane-listen",
                             "127.0.0.1:%d" % dp_port, "--config", cfg], env=env)
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
                   "OSR_CLASS": self.CLASS, "EXPECT_DOMAIN": domain,
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


class SdkExecContainer(SdkExecBase, unittest.TestCase):
    CLASS = "container"
    BINARY = "bwrap"


class SdkExecGvisor(SdkExecBase, unittest.TestCase):
    CLASS = "gvisor"
    BINARY = "runsc"


if __name__ == "__main__":
    osrtest.run()
