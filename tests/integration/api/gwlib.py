"""Helpers for the sandbox API, recovery and reaper integration tests: start
osr-gateway with a temp data dir and a JSON (= YAML) config file, talk to it
with urllib (HTTP/1.1) or curl (HTTP/1.1 and --http2-prior-knowledge), make
tenant keys through the admin API, and run an external osr-sim."""
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import osrtest

GATEWAY = os.environ.get("OSR_GATEWAY", "")
BUILD = os.environ.get("OSR_BUILD_ROOT", "")
ADMIN_KEY = "osr-admin-test-key-0123456789abcdef"


def _find_sim():
    env = os.environ.get("OSR_SIM")
    if env:
        return env
    for cand in ("src/osr-sim", "src/sim/osr-sim", "osr-sim"):
        p = os.path.join(BUILD, cand)
        if os.path.exists(p):
            return p
    return None


class Resp:
    def __init__(self, status, body, headers=None, version=None):
        self.status = status
        self.raw = body
        self.headers = headers or {}
        self.version = version
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None

    @property
    def code(self):
        """The typed error code, or None."""
        if isinstance(self.json, dict) and isinstance(self.json.get("error"), dict):
            return self.json["error"].get("code")
        return None

    def __repr__(self):
        return "Resp(%d, %r)" % (self.status, self.raw[:400])


class Gateway:
    """osr-gateway on 127.0.0.1:0 with its own data dir. `providers` is the
    providers list of the config file; `cfg` more top-level config keys."""

    def __init__(self, providers=None, store=None, redis=None, cfg=None, data_dir=None, env=None):
        self.dir = data_dir or tempfile.mkdtemp(prefix="osr-gw-")
        self.own_dir = data_dir is None
        conf = {"providers": providers or [{"name": "sim", "type": "sim", "latency_ms": 5}],
                "reaper": {"interval_ms": 1000}}
        conf.update(cfg or {})
        self.cfg_path = os.path.join(self.dir, "osr.yaml")
        with open(self.cfg_path, "w") as f:
            json.dump(conf, f)
        self.argv = [GATEWAY, "--listen", "127.0.0.1:0", "--data-dir", self.dir, "--config", self.cfg_path]
        if store:
            self.argv += ["--store", store]
        if redis:
            self.argv += ["--redis", redis]
        self.env = {"OSR_ADMIN_KEY": ADMIN_KEY}
        self.env.update(env or {})
        self.proc = None
        self.start()

    def start(self):
        self.proc = osrtest.Proc(self.argv, env=self.env)
        end = time.time() + 30
        while time.time() < end:
            m = re.search(r"listening on \S+ \(port (\d+)", self.proc.stderr_text())
            if m:
                self.port = int(m.group(1))
                return
            if not self.proc.alive():
                raise AssertionError("gateway exited:\n" + self.proc.stderr_text())
            time.sleep(0.05)
        raise AssertionError("gateway did not report its port:\n" + self.proc.stderr_text())

    def kill9(self):
        os.killpg(self.proc.p.pid, signal.SIGKILL)
        self.proc.p.wait(10)
        self.proc = None

    def stop(self):
        """SIGTERM (drain); returns the exit code (None if not started)."""
        if self.proc is None:
            return None
        rc = self.proc.stop()
        self.proc = None
        return rc

    def close(self):
        proc = self.proc
        rc = self.stop()
        if proc is None:
            rc = None
        if self.own_dir:
            subprocess.run(["rm", "-rf", self.dir])
        # A clean drain exits 0; sanitizer reports (leaks included) do not.
        if rc not in (0, None):
            raise AssertionError("gateway exited with %s:\n%s" % (rc, proc.stderr_text()[-4000:]))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def base(self):
        return "http://127.0.0.1:%d" % self.port

    # ---- requests ---------------------------------------------------------

    def req(self, method, path, body=None, key=None, headers=None, raw=None, timeout=70):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"} if data is not None else {}
        if key is not None:
            h["Authorization"] = "Bearer " + key
        h.update(headers or {})
        r = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(r, timeout=timeout) as resp:
                return Resp(resp.status, resp.read().decode(), dict(resp.headers))
        except urllib.error.HTTPError as e:
            return Resp(e.code, e.read().decode(), dict(e.headers))

    def curl(self, method, path, body=None, key=None, headers=None, h2=False):
        args = ["curl", "-sS", "--max-time", "70", "-X", method, "-w", "\n%{http_code} %{http_version}"]
        if h2:
            args.append("--http2-prior-knowledge")
        if key is not None:
            args += ["-H", "Authorization: Bearer " + key]
        for k, v in (headers or {}).items():
            args += ["-H", "%s: %s" % (k, v)]
        if body is not None:
            args += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
        args.append(self.base + path)
        cp = osrtest.sh(args, timeout=80)
        out, _, tail = cp.stdout.decode().rpartition("\n")
        code, ver = tail.split()
        return Resp(int(code), out, version=ver)

    def new_key(self, tenant, role=None):
        body = {"tenant": tenant}
        if role:
            body["role"] = role
        r = self.req("POST", "/v1/keys", body, key=ADMIN_KEY)
        assert r.status == 201, r
        return r.json["key"]

    def create(self, key, body=None, idem=None, **kw):
        h = {"Idempotency-Key": idem} if idem else None
        return self.req("POST", "/v1/sandboxes", body if body is not None else {}, key=key, headers=h, **kw)

    def list_all(self, key, query=""):
        items, cursor = [], None
        for _ in range(1000):
            q = query + ("&" if query else "") + "limit=1000" + ("&cursor=" + cursor if cursor else "")
            r = self.req("GET", "/v1/sandboxes?" + q, key=key)
            assert r.status == 200, r
            items += r.json["items"]
            cursor = r.json.get("nextCursor")
            if not cursor:
                return items
        raise AssertionError("too many pages")

    def wait(self, pred, timeout=20.0, what="condition"):
        end = time.time() + timeout
        while time.time() < end:
            v = pred()
            if v:
                return v
            time.sleep(0.1)
        raise AssertionError("timed out waiting for " + what)


class Sim:
    """An external osr-sim (resources outlive the gateway). Its own list is
    GET /v1/resources."""

    def __init__(self, *args):
        exe = _find_sim()
        if exe is None:
            raise RuntimeError("osr-sim not built")
        self.dir = tempfile.mkdtemp(prefix="osr-sim-")
        self.proc = osrtest.Proc([exe, "--listen", "127.0.0.1:0"] + list(args))
        line = self.proc.wait_line("listening ", timeout=20)
        self.port = int(line.split()[-1])
        self.proc.wait_line("ready", timeout=20)
        self.url = "http://127.0.0.1:%d" % self.port

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        r = urllib.request.Request(self.url + path, data=data, method=method,
                                   headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(r, timeout=30) as resp:
                b = resp.read().decode()
                return resp.status, (json.loads(b) if b else None)
        except urllib.error.HTTPError as e:
            b = e.read().decode()
            return e.code, (json.loads(b) if b else None)

    def resources(self):
        st, j = self.call("GET", "/v1/resources")
        assert st == 200, (st, j)
        return j["resources"] if isinstance(j, dict) else j

    def close(self):
        if self.proc.alive():
            self.proc.stop()
        subprocess.run(["rm", "-rf", self.dir])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def parallel(fn, n, timeout=120):
    """Run fn(i) in n threads; return the results in order (exceptions too)."""
    out = [None] * n

    def run(i):
        try:
            out[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            out[i] = e

    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    end = time.time() + timeout
    for t in ts:
        t.join(max(0.1, end - time.time()))
    assert not any(t.is_alive() for t in ts), "threads did not finish in time"
    return out
