"""`osr serve` with the local provider, end to end: sandboxes created through
the public API (POST /v1/sandboxes) run real bwrap/runsc sandboxes; a command
runs through the agent's unix socket (the binding's agent endpoint); DELETE
removes the process tree and every trace; a restarted gateway lists every
live sandbox (`osr ls`) and leaks none.

The data directory is a fresh mkdtemp (mode 0700), so this also covers the
state directory fallback for sandbox uids that cannot traverse it
(docs/local-provider.md, "State directory")."""
import glob
import hashlib
import hmac
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import osrtest  # noqa: E402
from test_local import Sandbox, pids_of, runtime_problem  # noqa: E402

CLI = os.environ.get("OSR_CLI", "")
ADMIN = "osr-admin-local-test-0123456789abcdef"


class Serve:
    def __init__(self, data_dir):
        self.dir = data_dir
        env = {"OSR_DATA_DIR": data_dir, "OSR_PROVIDERS": "local", "OSR_ADMIN_KEY": ADMIN}
        for k in ("OSR_LISTEN", "OSR_STORE", "OSR_REDIS", "OSR_CONFIG"):
            os.environ.pop(k, None)
        # The embedded data plane on port 0: never two servers on 7071.
        self.proc = osrtest.Proc([CLI, "serve", "--listen", "127.0.0.1:0", "--dataplane-listen",
                                  "127.0.0.1:0", "--log-level", "info"], env=env)
        end = time.time() + 60
        while time.time() < end:
            m = re.search(r"listening on \S+ \(port (\d+)", self.proc.stderr_text())
            if m:
                self.port = int(m.group(1))
                break
            if not self.proc.alive():
                raise AssertionError("osr serve exited:\n" + self.proc.stderr_text())
            time.sleep(0.05)
        else:
            raise AssertionError("osr serve did not start:\n" + self.proc.stderr_text())
        self.url = "http://127.0.0.1:%d" % self.port

    def req(self, method, path, body=None, timeout=120):
        data = json.dumps(body).encode() if body is not None else None
        h = {"Authorization": "Bearer " + ADMIN}
        if data is not None:
            h["Content-Type"] = "application/json"
        r = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(r, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            return e.code, json.loads(raw) if raw else None

    def stop(self):
        rc = self.proc.stop()
        if rc != 0:
            raise AssertionError("osr serve exited %r:\n%s" % (rc, self.proc.stderr_text()[-4000:]))


class Gateway(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("the local provider needs root")
        self.classes = [c for c in ("container", "gvisor") if runtime_problem(c) is None]
        if not self.classes:
            self.skipTest("neither bwrap nor runsc can run here")
        self.dir = tempfile.mkdtemp(prefix="osr-gwl-")  # 0700: not traversable
        self.servers = []
        self.live = {}  # provider id -> state dir of the sandbox
        self.roots = set()

    def serve(self):
        s = Serve(self.dir)
        self.servers.append(s)
        return s

    def tearDown(self):
        for s in self.servers:
            if s.proc.alive():
                s.proc.stop()
        # Anything left is a leak: remove it with a bare provider, then fail.
        leaked = [d for d in self.live.values() if os.path.exists(d)]
        if leaked:
            drv = os.environ.get("OSR_LOCAL_DRIVER")
            for root in {os.path.dirname(d) for d in leaked}:
                p = subprocess.Popen([drv, json.dumps({"state_dir": root})], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
                cmds = [json.dumps({"op": "list", "tag": 0})]
                cmds += [json.dumps({"op": "destroy", "tag": i + 1, "provider_id": os.path.basename(d)})
                         for i, d in enumerate(leaked) if os.path.dirname(d) == root]
                p.communicate("\n".join(cmds + [json.dumps({"op": "exit", "tag": 99})]) + "\n", timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)
        # The per-state-dir root under /run/osr is this test's alone (its data
        # dir was new): remove it once empty of sandboxes.
        for root in {os.path.dirname(d) for d in self.roots}:
            if root.startswith("/run/osr/local-") and not glob.glob(os.path.join(root, "l*")):
                shutil.rmtree(root, ignore_errors=True)
        self.assertEqual(leaked, [], "sandboxes leaked")

    def endpoint(self, sandbox_id):
        """The binding's agent endpoint, as the gateway stored it."""
        db = sqlite3.connect(os.path.join(self.dir, "osr.db"), timeout=30)
        try:
            row = db.execute("SELECT agent_endpoint FROM bindings WHERE id = ?", (sandbox_id,)).fetchone()
        finally:
            db.close()
        self.assertIsNotNone(row)
        return row[0]

    def agent_token(self, sandbox_id):
        with open(os.path.join(self.dir, "keys", "agent.secret")) as f:
            secret = bytes.fromhex(f.read().strip())
        return hmac.new(secret, sandbox_id.encode(), hashlib.sha256).hexdigest()

    def create(self, s, floor):
        st, b = s.req("POST", "/v1/sandboxes", {"capabilities": {"isolation": floor},
                                                "env": {"GREETING": "hello " + floor},
                                                "timeoutSeconds": 600})
        self.assertEqual(st, 201, b)
        self.assertEqual(b["binding"]["provider"], "local")
        ep = self.endpoint(b["id"])
        self.assertTrue(ep.startswith("unix:/"), ep)
        sock = ep[len("unix:"):]
        self.live[b["binding"]["providerId"]] = os.path.dirname(os.path.dirname(sock))
        self.roots.add(self.live[b["binding"]["providerId"]])
        # The agent checks hex(HMAC-SHA256(agent secret, sandbox id))
        # (docs/tokens.md, "The agent's token"), as the data plane sends it.
        sb = Sandbox({"provider_id": b["binding"]["providerId"], "agent_endpoint": ep},
                     self.agent_token(b["id"]))
        return b, sb

    def test_api_exec_kill_restart(self):
        s = self.serve()
        made = {}
        for cls in self.classes:
            b, sb = self.create(s, cls)
            # The floor gvisor can only be met by the gvisor class; the
            # container floor gets the cheaper container class when it exists.
            self.assertEqual(b["binding"]["isolation"], cls if "container" in self.classes or cls == "gvisor"
                             else "gvisor")
            code, out, err = sb.start("id -un; pwd; echo $GREETING; uname -r")
            self.assertEqual(code, 0, err)
            lines = out.decode().split("\n")
            self.assertEqual(lines[:3], ["user", "/home/user", "hello " + cls])
            made[cls] = (b, sb)
        # The sandbox state lives outside the 0700 data dir, where only the
        # sandbox's own uid (and root) may enter its socket directory.
        for b, sb in made.values():
            d = self.live[b["binding"]["providerId"]]
            self.assertFalse(d.startswith(self.dir), d)
            self.assertEqual(os.stat(os.path.join(d, "run")).st_mode & 0o777, 0o700)
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                                sys.executable, "-c",
                                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])",
                                sb.sock], capture_output=True, timeout=30)
            self.assertNotEqual(r.returncode, 0, "another uid reached the agent socket")
            self.assertIn(b"Permission denied", r.stderr)

        # DELETE: the process tree, the directory and the cgroups are gone.
        b, sb = made[self.classes[0]]
        pid_id = b["binding"]["providerId"]
        d = self.live[pid_id]
        with open(os.path.join(d, "meta.json")) as f:
            meta = json.load(f)
        pids = [meta["pid"]]
        for ctrl in ("pids", "memory"):
            try:
                with open("/sys/fs/cgroup/%s/osr/%s/cgroup.procs" % (ctrl, pid_id)) as f:
                    pids += [int(x) for x in f.read().split()]
            except OSError:
                pass
        self.assertEqual(s.req("DELETE", "/v1/sandboxes/" + b["id"])[0], 204)
        for _ in range(100):
            if not pids_of(pids) and not os.path.exists(d):
                break
            time.sleep(0.1)
        self.assertEqual(pids_of(pids), [])
        self.assertFalse(os.path.exists(d))
        self.assertEqual(glob.glob("/sys/fs/cgroup/*/osr/%s" % pid_id), [])
        del self.live[pid_id]
        self.assertEqual(s.req("GET", "/v1/sandboxes/" + b["id"])[1]["state"], "ended")

        # One more per class, then restart the gateway: every live sandbox is
        # still listed (osr ls) and still works; nothing was lost or leaked.
        more = [self.create(s, cls) for cls in self.classes]
        s.stop()
        s2 = self.serve()
        want = {b["id"] for b, _ in more} | {made[c][0]["id"] for c in self.classes[1:]}
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSR_")}
        env.update(OSR_URL=s2.url, OSR_KEY=ADMIN)
        cp = subprocess.run([CLI, "--json", "ls", "--state", "running", "--all-pages"],
                            capture_output=True, timeout=60, env=env)
        self.assertEqual(cp.returncode, 0, cp.stderr)
        listed = {it["id"] for it in json.loads(cp.stdout)["items"]}
        self.assertEqual(listed, want)
        for b, sb in more:
            self.assertEqual(sb.start("echo still")[1], b"still\n")
        # Give the reaper a round: it must not take live sandboxes away.
        time.sleep(1.5)
        for b, sb in more:
            self.assertEqual(s2.req("GET", "/v1/sandboxes/" + b["id"])[1]["state"], "running")
        for sid in want:
            self.assertEqual(s2.req("DELETE", "/v1/sandboxes/" + sid)[0], 204)
        for _ in range(100):
            if not any(os.path.exists(d) for d in self.live.values()):
                break
            time.sleep(0.1)
        self.assertEqual([d for d in self.live.values() if os.path.exists(d)], [])
        root = os.path.dirname(next(iter(self.live.values())))
        self.assertEqual([n for n in os.listdir(root) if n.startswith("l")], [])
        if "gvisor" in self.classes:
            r = subprocess.run(["runsc", "--root=" + os.path.join(root, "runsc"), "list", "-quiet"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.stdout.split(), [])
        self.live.clear()
        s2.stop()
        # A clean stop with no sandbox left removes the gateway's own
        # /run/osr/local-<hash> root (it used to stay behind, empty).
        self.assertFalse(os.path.exists(root), "%s left behind: %r" % (
            root, os.listdir(root) if os.path.isdir(root) else None))


if __name__ == "__main__":
    osrtest.run()
