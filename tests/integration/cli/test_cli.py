"""The `osr` command and the gateway configuration, end to end.

Everything runs the real binary: `osr serve` (the gateway with the SQLite
store and the sim provider) on a loopback port chosen by the kernel, and the
client commands against it. Configuration precedence is observed through
`osr serve --print-config` (the effective configuration, secrets redacted)
and through a running gateway (its listener and admin key).
"""
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "lib"))
import osrtest  # noqa: E402
import services  # noqa: E402

CLI = os.environ.get("OSR_CLI", "")
SECRET_ENV = "s3cr3t-from-env-8d1f"
SECRET_FILE = "s3cr3t-from-file-77aa"
COMMANDS = ["create", "plan", "ls", "get", "kill", "providers", "keys", "doctor"]


def clean_env(**extra):
    """The environment without any OSR_* variable, plus `extra`."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("OSR_") or k in ("OSR_CLI",)}
    e.update(extra)
    return e


def osr(*args, env=None, timeout=60, input=None):
    import subprocess
    cp = subprocess.run([CLI] + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        timeout=timeout, env=env if env is not None else clean_env(), input=input)
    return cp.returncode, cp.stdout.decode("utf-8", "replace"), cp.stderr.decode("utf-8", "replace")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Serve:
    """`osr serve` on 127.0.0.1:0 with its own data directory."""

    def __init__(self, *args, env=None, data_dir=None):
        self.dir = data_dir or tempfile.mkdtemp(prefix="osr-cli-")
        # sim unless a test asks otherwise: the embedded default would be the
        # local provider (real sandboxes) on a machine that can run them.
        e = clean_env(OSR_DATA_DIR=self.dir)
        if "--config" not in args and "--providers" not in args:
            e["OSR_PROVIDERS"] = "sim"
        if env:
            e.update(env)
        # The embedded data plane on port 0: servers running at once (here
        # or in another suite) must not fight over 7071.
        dpl = [] if "--dataplane-listen" in args else ["--dataplane-listen", "127.0.0.1:0"]
        self.proc = osrtest.Proc([CLI, "serve", "--listen", "127.0.0.1:0", "--log-level", "info"] + dpl
                                 + list(args), env=e)
        self.port = self._wait_port()
        self.url = "http://127.0.0.1:%d" % self.port

    def _wait_port(self, timeout=30.0):
        end = time.time() + timeout
        while time.time() < end:
            m = re.search(r"listening on \S+ \(port (\d+)", self.proc.stderr_text())
            if m and "ready" in self.proc.stderr_text():
                return int(m.group(1))
            if not self.proc.alive():
                raise RuntimeError("osr serve exited (%s):\n%s" % (self.proc.p.returncode, self.proc.stderr_text()))
            time.sleep(0.05)
        raise TimeoutError("osr serve did not start:\n" + self.proc.stderr_text())

    def env(self, **extra):
        return clean_env(OSR_URL=self.url, OSR_DATA_DIR=self.dir, **extra)

    def admin_key(self):
        with open(os.path.join(self.dir, "admin.key")) as f:
            return f.read().strip()

    def stop(self):
        rc = self.proc.stop(signal.SIGTERM, timeout=20)
        return rc

    def close(self):
        rc = self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        if rc not in (0, -signal.SIGTERM):
            raise AssertionError("osr serve exited %s:\n%s" % (rc, self.proc.stderr_text()[-4000:]))


class Help(unittest.TestCase):
    def test_top_level(self):
        rc, out, err = osr("--help")
        self.assertEqual(rc, 0, err)
        for c in ["serve"] + COMMANDS:
            self.assertIn(c, out)
        self.assertIn("exit codes", out)
        rc, out, err = osr()
        self.assertEqual(rc, 2)
        self.assertIn("usage:", err)

    def test_each_command(self):
        for c in COMMANDS:
            rc, out, err = osr(c, "--help")
            self.assertEqual(rc, 0, "%s --help: %s" % (c, err))
            self.assertIn("usage: osr %s" % c, out)
            self.assertIn("--url", out, c)
        rc, out, err = osr("create", "--help")
        for f in ("--template", "--gpu", "--snapshot", "--port", "--memory", "--vcpus", "--region",
                  "--isolation", "--strategy", "--allow", "--deny", "--max-cost", "--timeout",
                  "--idle-timeout", "--env", "--meta", "--idempotency-key"):
            self.assertIn(f, out)
        rc, out, err = osr("serve", "--help")
        self.assertEqual(rc, 0, err)
        for f in ("--config", "--listen", "--dataplane-listen", "--store", "--redis", "--data-dir",
                  "--providers", "--tls-cert", "--tls-key", "--drain-ms", "--log-level", "--log-json",
                  "--print-config", "OSR_LISTEN", "OSR_ADMIN_KEY"):
            self.assertIn(f, out)
        rc, out, err = osr("help", "ls")
        self.assertEqual(rc, 0)
        self.assertIn("usage: osr ls", out)

    def test_unknown(self):
        rc, out, err = osr("frobnicate")
        self.assertEqual(rc, 2)
        self.assertIn("unknown command", err)
        rc, out, err = osr("ls", "--bogus")
        self.assertEqual(rc, 2)
        self.assertIn("--bogus", err)
        rc, out, err = osr("serve", "--bogus")
        self.assertEqual(rc, 2)
        self.assertIn("--bogus", err)


class Config(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="osr-cfg-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, name, text):
        p = os.path.join(self.dir, name)
        with open(p, "w") as f:
            f.write(text)
        return p

    def effective(self, *args, env=None):
        rc, out, err = osr("serve", "--print-config", *args, env=env if env is not None else clean_env(HOME=self.dir))
        self.assertEqual(rc, 0, err)
        return json.loads(out)

    def test_defaults(self):
        rc, out, err = osr("serve", "--print-config", env=clean_env(HOME=self.dir))
        self.assertEqual(rc, 0, err)
        c = json.loads(out)
        # The embedded default provider: local when a sandbox runtime works
        # here, else sim with a warning naming what is missing.
        if "using the simulator" in err:
            self.assertEqual([p["type"] for p in c["providers"]], ["sim"])
        else:
            self.assertEqual([p["type"] for p in c["providers"]], ["local"])
            self.assertEqual(os.geteuid(), 0)
        self.assertEqual(c["listen"], ["127.0.0.1:7070"])
        self.assertEqual(c["dataplane"]["listen"], "127.0.0.1:7071")
        self.assertEqual(c["data_dir"], os.path.join(self.dir, ".local/share/osr"))
        self.assertEqual(c["store"], "sqlite:%s/.local/share/osr/osr.db" % self.dir)
        self.assertIsNone(c["redis"])
        self.assertEqual(c["drain_ms"], 10000)
        self.assertEqual(c["breaker"]["window"], 20)
        self.assertEqual(c["sandbox"]["default_timeout_seconds"], 300)

    def test_precedence_file_env_flag(self):
        f = self.write("osr.yaml", "listen: ['127.0.0.1:1111']\nstore: 'sqlite:/from/file.db'\n"
                                   "redis: 'redis://127.0.0.1:1'\ndrain_ms: 111\nproviders: [{name: f, type: sim}]\n"
                                   "log: {level: debug}\n")
        # file over defaults (found through OSR_CONFIG)
        c = self.effective(env=clean_env(HOME=self.dir, OSR_CONFIG=f))
        self.assertEqual(c["config_file"], f)
        self.assertEqual(c["listen"], ["127.0.0.1:1111"])
        self.assertEqual(c["store"], "sqlite:/from/file.db")
        self.assertEqual(c["drain_ms"], 111)
        self.assertEqual([p["name"] for p in c["providers"]], ["f"])
        self.assertEqual(c["log"]["level"], "debug")
        # environment over file
        env = clean_env(HOME=self.dir, OSR_CONFIG=f, OSR_LISTEN="127.0.0.1:2222,127.0.0.1:2223",
                        OSR_STORE="sqlite:/from/env.db", OSR_PROVIDERS="sim,sim", OSR_LOG_LEVEL="warn",
                        OSR_REDIS="redis://127.0.0.1:2", OSR_DATA_DIR="/from/env")
        c = self.effective(env=env)
        self.assertEqual(c["listen"], ["127.0.0.1:2222", "127.0.0.1:2223"])
        self.assertEqual(c["store"], "sqlite:/from/env.db")
        self.assertEqual(c["redis"], "redis://127.0.0.1:2")
        self.assertEqual([p["name"] for p in c["providers"]], ["sim", "sim-2"])
        self.assertEqual(c["log"]["level"], "warn")
        self.assertEqual(c["data_dir"], "/from/env")
        self.assertEqual(c["drain_ms"], 111)  # not overridden: still the file's
        # flags over environment
        c = self.effective("--listen", "127.0.0.1:3333", "--store", "sqlite:/from/flag.db", "--providers",
                           '[{"name":"x","type":"sim"}]', "--drain-ms", "333", "--log-level", "error",
                           "--redis", "none", "--data-dir", "/from/flag", env=env)
        self.assertEqual(c["listen"], ["127.0.0.1:3333"])
        self.assertEqual(c["store"], "sqlite:/from/flag.db")
        self.assertIsNone(c["redis"])
        self.assertEqual([p["name"] for p in c["providers"]], ["x"])
        self.assertEqual(c["drain_ms"], 333)
        self.assertEqual(c["log"]["level"], "error")
        self.assertEqual(c["data_dir"], "/from/flag")
        # --config beats OSR_CONFIG
        g = self.write("other.yaml", "drain_ms: 444\n")
        c = self.effective("--config", g, env=clean_env(HOME=self.dir, OSR_CONFIG=f))
        self.assertEqual(c["drain_ms"], 444)
        self.assertEqual(c["config_file"], g)

    def test_precedence_observed_on_a_running_gateway(self):
        # The file says one port, the environment another, the flag a third:
        # the gateway listens where the flag says.
        pf, pe = free_port(), free_port()
        f = self.write("osr.yaml", "listen: ['127.0.0.1:%d']\n" % pf)
        d = tempfile.mkdtemp(prefix="osr-cli-", dir=self.dir)
        s = Serve("--config", f, env={"OSR_LISTEN": "127.0.0.1:%d" % pe}, data_dir=d)
        try:
            self.assertNotIn(s.port, (pf, pe))
            rc, out, err = osr("--json", "--url", s.url, "providers", env=s.env())
            self.assertEqual(rc, 0, err)
        finally:
            s.close()
        # Without the flag, the environment wins over the file.
        args = [CLI, "serve", "--config", f, "--log-level", "info", "--dataplane-listen", "127.0.0.1:0"]
        p = osrtest.Proc(args, env=clean_env(OSR_DATA_DIR=d, OSR_LISTEN="127.0.0.1:%d" % pe))
        try:
            end = time.time() + 30
            while "ready" not in p.stderr_text() and p.alive() and time.time() < end:
                time.sleep(0.05)
            self.assertIn("(port %d" % pe, p.stderr_text())
            rc, out, err = osr("providers", "--url", "http://127.0.0.1:%d" % pe, env=clean_env(OSR_DATA_DIR=d))
            self.assertEqual(rc, 0, err)
        finally:
            self.assertIn(p.stop(), (0, -signal.SIGTERM))

    def yaml_error(self, text, want):
        f = self.write("bad.yaml", text)
        rc, out, err = osr("serve", "--config", f, "--print-config", env=clean_env(HOME=self.dir))
        self.assertEqual(rc, 2, err)
        self.assertEqual(out, "")
        for w in want:
            self.assertIn(w % {"f": f}, err)
        # the gateway proper (no --print-config) refuses the same file
        rc, out, err2 = osr("serve", "--config", f, "--listen", "127.0.0.1:0", env=clean_env(HOME=self.dir))
        self.assertEqual(rc, 2, err2)
        self.assertIn(f, err2)

    def test_yaml_errors(self):
        self.yaml_error("listen: ['127.0.0.1:1'\nstore: x\n", ["%(f)s:", "line" if False else "%(f)s:"])
        self.yaml_error("drain_ms: 5\nbreaker:\n  window: 10\n  windw: 3\n", ["%(f)s:4: breaker.windw: unknown key"])
        self.yaml_error("store: sqlite:/x\ndrain_ms: soon\n", ["%(f)s:2: drain_ms: expected an integer"])
        self.yaml_error("providers:\n  - {name: a, type: sim}\n  - {name: 7, type: sim}\n",
                        ["%(f)s:3: providers[1].name: expected a string"])
        self.yaml_error("a: &x 1\nb: *x\n", ["%(f)s:1: anchors"])

    def test_syntax_error_line(self):
        f = self.write("bad.yaml", "listen: ['127.0.0.1:1']\nstore: 'sqlite:/x'\nproviders: [\n")
        rc, out, err = osr("serve", "--config", f, "--print-config", env=clean_env(HOME=self.dir))
        self.assertEqual(rc, 2)
        self.assertRegex(err, re.escape(f) + r":[34]: ")

    def test_bad_flags_and_env(self):
        rc, out, err = osr("serve", "--print-config", "--drain-ms", "soon", env=clean_env(HOME=self.dir))
        self.assertEqual(rc, 2)
        self.assertIn("--drain-ms", err)
        rc, out, err = osr("serve", "--print-config", env=clean_env(HOME=self.dir, OSR_LOG_LEVEL="loud"))
        self.assertEqual(rc, 2)
        self.assertIn("OSR_LOG_LEVEL", err)
        rc, out, err = osr("serve", "--print-config", env=clean_env(HOME=self.dir, OSR_PROVIDERS="[{"))
        self.assertEqual(rc, 2)
        self.assertIn("OSR_PROVIDERS", err)

    def test_example_config_loads(self):
        ex = os.path.join(osrtest.SOURCE_ROOT, "examples", "osr.yaml")
        c = self.effective("--config", ex)
        self.assertEqual([p["name"] for p in c["providers"]], ["sim-fast", "sim-flaky"])
        self.assertEqual(c["prices"]["sim-flaky"]["vcpu_per_s"], 0.000014)
        # and a gateway starts from it
        s = Serve("--config", ex)
        try:
            rc, out, err = osr("providers", "--json", env=s.env())
            self.assertEqual(rc, 0, err)
            self.assertEqual([p["name"] for p in json.loads(out)["providers"]], ["sim-fast", "sim-flaky"])
        finally:
            s.close()


class Secrets(unittest.TestCase):
    def test_secrets_resolved_and_never_printed(self):
        d = tempfile.mkdtemp(prefix="osr-sec-")
        try:
            with open(os.path.join(d, "admin.secret"), "w") as f:
                f.write(SECRET_FILE + "\n")
            cfg = os.path.join(d, "osr.yaml")
            with open(cfg, "w") as f:
                f.write("admin_key: {file: admin.secret}\n"
                        "store: 'postgres://osr:pgpass-5521@127.0.0.1:1/osr'\n"
                        "providers:\n  - name: s\n    type: sim\n    api_token: {env: T_SECRET}\n")
            env = clean_env(HOME=d, T_SECRET=SECRET_ENV)
            rc, out, err = osr("serve", "--config", cfg, "--print-config", env=env)
            self.assertEqual(rc, 0, err)
            for s in (SECRET_FILE, SECRET_ENV, "pgpass-5521"):
                self.assertNotIn(s, out + err)
            c = json.loads(out)
            self.assertEqual(c["admin_key"]["file"], "admin.secret")
            self.assertEqual(c["admin_key"]["value"], "<redacted>")
            self.assertEqual(c["providers"][0]["api_token"], {"env": "T_SECRET", "value": "<redacted>"})
            # A missing variable is an error that names the key, not the value.
            rc, out, err = osr("serve", "--config", cfg, "--print-config", env=clean_env(HOME=d))
            self.assertEqual(rc, 2)
            self.assertIn("providers[0].api_token", err)
            self.assertIn("T_SECRET", err)

            # On a real gateway: the {file:} admin key is the one that works,
            # and it never appears in the gateway's log or in doctor.
            with open(cfg, "w") as f:
                f.write("admin_key: {file: %s}\n" % os.path.join(d, "admin.secret"))
            s = Serve("--config", cfg, "--log-level", "debug", data_dir=os.path.join(d, "data"))
            try:
                rc, out, err = osr("ls", "--key", SECRET_FILE, env=s.env())
                self.assertEqual(rc, 0, err)
                rc, out, err = osr("ls", "--key", "wrong", env=s.env())
                self.assertEqual(rc, 5, err)
                rc, out, err = osr("doctor", "--json", "--config", cfg, "--key", SECRET_FILE,
                                   env=s.env(HOME=d))
                self.assertNotIn(SECRET_FILE, out + err)
                self.assertEqual(json.loads(out)["config"]["admin_key"]["value"], "<redacted>")
            finally:
                s.close()
            self.assertNotIn(SECRET_FILE, s.proc.stderr_text())
            # OSR_ADMIN_KEY (environment) sets the admin key too.
            s = Serve(env={"OSR_ADMIN_KEY": SECRET_ENV}, data_dir=os.path.join(d, "data2"))
            try:
                rc, out, err = osr("providers", "--key", SECRET_ENV, env=s.env())
                self.assertEqual(rc, 0, err)
                rc, out, err = osr("serve", "--print-config", env=clean_env(HOME=d, OSR_ADMIN_KEY=SECRET_ENV))
                self.assertEqual(rc, 0, err)
                self.assertNotIn(SECRET_ENV, out)
            finally:
                s.close()
            self.assertNotIn(SECRET_ENV, s.proc.stderr_text())
        finally:
            shutil.rmtree(d, ignore_errors=True)


class Client(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Serve("--providers", "sim,sim")

    @classmethod
    def tearDownClass(cls):
        cls.s.close()

    def run_ok(self, *args, **kw):
        rc, out, err = osr(*args, env=self.s.env(**kw))
        self.assertEqual(rc, 0, "osr %s: %s%s" % (" ".join(args), out, err))
        return out, err

    def test_lifecycle_human_and_json(self):
        # create (human): the single-object view
        out, _ = self.run_ok("create", "--template", "base", "--meta", "team=red", "--env", "A=1",
                             "--timeout", "120", "--vcpus", "1", "--isolation", "container")
        m = re.search(r"^id\s+(\S+)$", out, re.M)
        self.assertIsNotNone(m, out)
        sid = m.group(1)
        self.assertRegex(out, r"(?m)^state\s+running$")
        self.assertRegex(out, r"(?m)^provider\s+sim(-2)?$")
        self.assertRegex(out, r"(?m)^metadata\s+team=red$")
        self.assertRegex(out, r"(?m)^token\s+\S+")
        # create (json): the API's answer exactly, with an idempotency key
        out, _ = self.run_ok("--json", "create", "--template", "base", "--meta", "team=blue",
                             "--idempotency-key", "k-1")
        j = json.loads(out)
        self.assertEqual(j["state"], "running")
        out2, _ = self.run_ok("--json", "create", "--template", "base", "--meta", "team=blue",
                              "--idempotency-key", "k-1")
        self.assertEqual(json.loads(out2)["id"], j["id"])
        # get
        out, _ = self.run_ok("get", sid)
        self.assertRegex(out, r"(?m)^id\s+%s$" % sid)
        out, _ = self.run_ok("get", sid, "--json")
        self.assertEqual(json.loads(out)["id"], sid)
        # ls: table with both, filters, json pages
        out, _ = self.run_ok("ls")
        lines = out.strip().splitlines()
        self.assertTrue(lines[0].startswith("ID"), out)
        self.assertIn("STATE", lines[0])
        self.assertTrue(any(l.startswith(sid) for l in lines))
        self.assertTrue(any(l.startswith(j["id"]) for l in lines))
        out, _ = self.run_ok("ls", "--meta", "team=red", "--json")
        ids = [x["id"] for x in json.loads(out)["items"]]
        self.assertEqual(ids, [sid])
        out, _ = self.run_ok("ls", "--limit", "1", "--all-pages", "--json")
        ids = {x["id"] for x in json.loads(out)["items"]}
        self.assertTrue({sid, j["id"]} <= ids)
        out, _ = self.run_ok("ls", "--limit", "1", "--json")
        page = json.loads(out)
        self.assertEqual(len(page["items"]), 1)
        self.assertIsNotNone(page["nextCursor"])
        # kill both, then they are ended
        out, _ = self.run_ok("kill", sid)
        self.assertIn("killed %s" % sid, out)
        out, _ = self.run_ok("kill", j["id"], "--json")
        out, _ = self.run_ok("get", sid, "--json")
        self.assertEqual(json.loads(out)["state"], "ended")
        out, _ = self.run_ok("ls", "--state", "running", "--json")
        self.assertNotIn(sid, [x["id"] for x in json.loads(out)["items"]])

    def test_plan(self):
        out, _ = self.run_ok("plan", "--vcpus", "1")
        self.assertIn("PROVIDER", out.splitlines()[0])
        self.assertIn("order: sim", out)
        out, _ = self.run_ok("plan", "--gpu", "1:a100")
        self.assertIn("gpu=FAILED", out)
        self.assertIn("order: none", out)
        out, _ = self.run_ok("plan", "--strategy", "pin:sim-2", "--json")
        j = json.loads(out)
        self.assertEqual(j["order"], ["sim-2"])
        self.assertEqual(len(j["providers"]), 2)

    def test_providers(self):
        out, _ = self.run_ok("providers")
        lines = out.strip().splitlines()
        self.assertTrue(lines[0].startswith("NAME"))
        self.assertIn("BREAKER", lines[0])
        self.assertEqual(sorted(l.split()[0] for l in lines[1:]), ["sim", "sim-2"])
        self.assertIn("closed", out)
        out, _ = self.run_ok("providers", "--json")
        self.assertEqual([p["name"] for p in json.loads(out)["providers"]], ["sim", "sim-2"])

    def test_keys(self):
        out, err = self.run_ok("keys", "create", "--tenant", "acme", "--name", "ci")
        key = re.search(r"(?m)^key\s+(\S+)$", out).group(1)
        kid = re.search(r"(?m)^key id\s+(\S+)$", out).group(1)
        self.assertIn("only once", err)
        out, _ = self.run_ok("keys", "ls")
        self.assertIn(kid, out)
        self.assertNotIn(key, out)
        out, _ = self.run_ok("keys", "ls", "--tenant", "acme", "--json")
        self.assertEqual([k["keyId"] for k in json.loads(out)["items"]], [kid])
        # the tenant key works, sees only its own sandboxes, cannot manage keys
        env = clean_env(OSR_URL=self.s.url, OSR_KEY=key)
        rc, out, err = osr("--json", "create", env=env)
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["tenant"], "acme")
        rc, out, err = osr("keys", "create", "--tenant", "evil", env=env)
        self.assertEqual(rc, 5, err)
        self.assertIn("error forbidden", err)
        # revoke: the key stops working
        out, _ = self.run_ok("keys", "revoke", kid)
        self.assertIn("revoked", out)
        rc, out, err = osr("ls", env=env)
        self.assertEqual(rc, 5, err)
        out, _ = self.run_ok("keys", "create", "--tenant", "ops", "--admin", "--json")
        self.assertEqual(json.loads(out)["role"], "admin")

    def test_h2c(self):
        out, _ = self.run_ok("--h2c", "providers", "--json")
        self.assertIn("sim-2", out)


class ExitCodes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Serve()

    @classmethod
    def tearDownClass(cls):
        cls.s.close()

    def test_unreachable(self):
        port = free_port()
        rc, out, err = osr("ls", "--url", "http://127.0.0.1:%d" % port, "--key", "x")
        self.assertEqual(rc, 3)
        self.assertIn("cannot reach", err)
        rc, out, err = osr("providers", env=clean_env(OSR_URL="http://127.0.0.1:%d" % port))
        self.assertEqual(rc, 3)

    def test_not_found(self):
        rc, out, err = osr("get", "aaaaaaaaaaaaaaaaaaaa", env=self.s.env())
        self.assertEqual(rc, 4)
        self.assertRegex(err, r"^error not_found: ")
        rc, out, err = osr("kill", "aaaaaaaaaaaaaaaaaaaa", env=self.s.env())
        self.assertEqual(rc, 4)
        rc, out, err = osr("get", "aaaaaaaaaaaaaaaaaaaa", "--json", env=self.s.env())
        self.assertEqual(rc, 4)
        self.assertEqual(json.loads(out)["error"]["code"], "not_found")

    def test_unauthorized(self):
        rc, out, err = osr("ls", "--key", "nope", env=self.s.env())
        self.assertEqual(rc, 5)
        self.assertIn("error unauthorized", err)
        # no key at all: not a local default data dir -> no key sent
        rc, out, err = osr("ls", env=clean_env(OSR_URL=self.s.url, HOME="/nonexistent"))
        self.assertEqual(rc, 5)

    def test_usage(self):
        for args in (["create", "--gpu", "x"], ["create", "--port", "70000"], ["ls", "--limit", "0"],
                     ["get"], ["kill"], ["keys"], ["keys", "create"], ["create", "--isolation", "vm"],
                     ["--url", "ftp://x", "ls"], ["ls", "--state"]):
            rc, out, err = osr(*args, env=self.s.env())
            self.assertEqual(rc, 2, "%s: %s" % (args, err))

    def test_tls(self):
        certs = osrtest.Certs()
        try:
            s = Serve("--tls-cert", certs.cert, "--tls-key", certs.key)
            try:
                url = "https://127.0.0.1:%d" % s.port
                rc, out, err = osr("providers", "--json", "--url", url, "--ca", certs.ca, env=s.env())
                self.assertEqual(rc, 0, err)
                self.assertIn("sim", out)
                # without our CA the certificate does not verify: unreachable
                rc, out, err = osr("providers", "--url", url, env=s.env())
                self.assertEqual(rc, 3, err)
                # an unreadable --ca is a usage error
                rc, out, err = osr("providers", "--url", url, "--ca", "/nonexistent.pem", env=s.env())
                self.assertEqual(rc, 2, err)
                self.assertIn("/nonexistent.pem", err)
            finally:
                s.close()
        finally:
            certs.cleanup()

    def test_api_error(self):
        rc, out, err = osr("create", "--strategy", "fastest", env=self.s.env())
        self.assertEqual(rc, 1, err)
        self.assertRegex(err, r"^error invalid_request: ")
        rc, out, err = osr("create", "--gpu", "2", env=self.s.env())
        self.assertEqual(rc, 1, err)
        self.assertIn("error no_capable_provider", err)
        # details are indented under the error line
        self.assertRegex(err, r"\n  \S")


class Doctor(unittest.TestCase):
    def test_missing_redis_fails_with_fix(self):
        d = tempfile.mkdtemp(prefix="osr-doc-")
        try:
            port = free_port()  # nothing listens here
            rc, out, err = osr("doctor", "--data-dir", d, "--redis", "redis://127.0.0.1:%d" % port,
                               "--url", "http://127.0.0.1:%d" % free_port(), env=clean_env(HOME=d), timeout=60)
            self.assertEqual(rc, 1, out + err)
            self.assertRegex(out, r"(?m)^FAIL\s+redis\s+redis://127\.0\.0\.1:%d" % port)
            self.assertRegex(out, r"(?m)^\s+fix: .*redis-server")
            self.assertRegex(out, r"(?m)^OK\s+config")
            self.assertRegex(out, r"(?m)^OK\s+data dir")
            self.assertRegex(out, r"(?m)^OK\s+store\s+sqlite:")
            # The embedded default provider: local where sandboxes can run, else sim.
            self.assertRegex(out, r"(?m)^OK\s+provider (sim|local)")
            self.assertRegex(out, r"(?m)^FAIL\s+gateway")
            for rt in ("runsc", "bwrap", "crun"):
                self.assertRegex(out, r"(?m)^(OK|WARN)\s+runtime %s" % rt)
            if shutil.which("bwrap") is None:
                self.assertIn("apt-get install -y bubblewrap", out)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_healthy_setup_with_redis(self):
        with services.RedisServer() as r:
            s = Serve("--redis", r.url)
            try:
                rc, out, err = osr("doctor", "--redis", r.url, "--data-dir", s.dir, "--json",
                                   env=s.env(HOME=s.dir))
                j = json.loads(out)
                by = {c["name"]: c for c in j["checks"]}
                self.assertEqual(by["redis"]["status"], "OK", out)
                self.assertEqual(by["store"]["status"], "OK", out)
                self.assertEqual(by["gateway"]["status"], "OK", out)
                self.assertEqual(by["api key"]["status"], "OK", out)
                self.assertEqual(j["fail"], 0, out)
                self.assertEqual(rc, 0, out + err)
            finally:
                s.close()

    def test_bad_config_and_unknown_adapter(self):
        d = tempfile.mkdtemp(prefix="osr-doc-")
        try:
            rc, out, err = osr("doctor", "--data-dir", d, "--providers", "sim,nosuchcloud",
                               "--url", "http://127.0.0.1:%d" % free_port(), env=clean_env(HOME=d))
            self.assertEqual(rc, 1)
            self.assertRegex(out, r"(?m)^FAIL\s+provider nosuchcloud-?\S*\s+adapter type 'nosuchcloud'")
            self.assertRegex(out, r"(?m)^\s+fix: use one of: .*sim")
            bad = os.path.join(d, "bad.yaml")
            with open(bad, "w") as f:
                f.write("breaker: {windw: 1}\n")
            rc, out, err = osr("doctor", "--config", bad, "--url", "http://127.0.0.1:%d" % free_port(),
                               env=clean_env(HOME=d))
            self.assertEqual(rc, 1)
            self.assertRegex(out, r"(?m)^FAIL\s+config\s+%s:1: breaker.windw: unknown key" % re.escape(bad))
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    osrtest.run()
