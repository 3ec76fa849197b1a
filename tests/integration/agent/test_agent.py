"""osr-agent integration tests: a real agent, real processes, real peers
(curl, python http.client and http.server, raw sockets).

Each TestCase class is one meson test (tests/integration/agent/meson.build).
"""
import base64
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import agentlib  # noqa: E402
from agentlib import Agent, b64, collect_process  # noqa: E402
import osrtest  # noqa: E402

START = "process.Process/Start"
CONNECT = "process.Process/Connect"


def start_sh(agent, script, unix=False, headers=None, extra=None, timeout=120):
    msg = {"process": {"cmd": "/bin/sh", "args": ["-c", script]}}
    if extra:
        msg.update(extra)
    return agent.stream(START, msg, unix=unix, headers=headers, timeout=timeout)


def signum(name):
    """A signal as strace names it: SIGHUP, SIGRTMIN (= 32), SIGRT_1 (= 33),
    or a number."""
    if name == "SIGRTMIN":
        return 32
    if name.startswith("SIGRT_"):
        return 32 + int(name[6:])
    if name.startswith("SIG"):
        return int(signal.Signals[name])
    return int(name)


def wait_for(pred, timeout=10.0, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Exec(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.agent = Agent()

    @classmethod
    def tearDownClass(cls):
        cls.agent.stop()

    def test_echo_tcp_and_unix(self):
        for unix in (False, True):
            st = self.agent.stream(START, {"process": {"cmd": "/bin/echo", "args": ["hello", "world"]}},
                                   unix=unix)
            self.assertEqual(st.status, 200)
            self.assertEqual(st.resp.getheader("content-type"), "application/connect+json")
            start, out, err, end, eos, frames = collect_process(st)
            self.assertGreater(start["pid"], 0)
            self.assertEqual(out, b"hello world\n")
            self.assertEqual(err, b"")
            self.assertEqual(end, {"exited": True, "status": "exit status 0"})
            self.assertEqual(eos, {})

    def test_exit_code_and_stderr(self):
        start, out, err, end, eos, _ = collect_process(start_sh(self.agent, "echo out; echo err >&2; exit 7"))
        self.assertEqual((out, err), (b"out\n", b"err\n"))
        self.assertEqual(end, {"exitCode": 7, "exited": True, "status": "exit status 7",
                               "error": "exit status 7"})
        self.assertEqual(eos, {})

    def test_binary_safe(self):
        # All 256 byte values, several times, through printf's octal escapes.
        script = "i=0; while [ $i -lt 4 ]; do " + "".join(
            "printf '\\%03o';" % b for b in range(256)) + " i=$((i+1)); done"
        _, out, _, end, _, _ = collect_process(start_sh(self.agent, script))
        self.assertEqual(out, bytes(range(256)) * 4)
        self.assertEqual(end["status"], "exit status 0")

    def test_env_order_cwd_user(self):
        # env(1) directly (a shell would reorder its environment).
        msg = {"process": {"cmd": "/usr/bin/env", "envs": {"ZED": "1", "HOME": "/override"}}}
        _, out, _, end, _, _ = collect_process(self.agent.stream(START, msg))
        lines = out.decode().splitlines()
        names = [ln.split("=", 1)[0] for ln in lines]
        # envd's order: PATH, HOME, USER, LOGNAME, sandbox envs, request envs;
        # a repeated name keeps its last value at its last position.
        self.assertEqual(names, ["PATH", "USER", "LOGNAME", "ZED", "HOME"])
        self.assertEqual(lines[-1], "HOME=/override")
        msg = {"process": {"cmd": "/bin/pwd", "cwd": "/tmp"}}
        _, out, _, _, _, _ = collect_process(self.agent.stream(START, msg))
        self.assertEqual(out, b"/tmp\n")
        # A missing cwd is invalid_argument, no process.
        st = self.agent.stream(START, {"process": {"cmd": "/bin/true", "cwd": "/no/such/dir"}})
        frames = list(st.frames())
        self.assertEqual(frames, [])
        self.assertEqual(st.end["error"]["code"], "invalid_argument")

    def test_stdin_send_and_close(self):
        st = self.agent.stream(START, {"process": {"cmd": "/bin/cat"}, "stdin": True})
        it = st.frames()
        first = next(it)
        pid = first["event"]["start"]["pid"]
        for chunk in (b"abc", bytes(range(256)), b"xyz\n"):
            code, body = self.agent.unary("process.Process/SendInput",
                                          {"process": {"pid": pid}, "input": {"stdin": b64(chunk)}})
            self.assertEqual((code, body), (200, {}))
        code, body = self.agent.unary("process.Process/CloseStdin", {"process": {"pid": pid}})
        self.assertEqual((code, body), (200, {}))
        out = bytearray()
        end = None
        for f in it:
            ev = f["event"]
            if "data" in ev:
                out += base64.b64decode(ev["data"]["stdout"])
            if "end" in ev:
                end = ev["end"]
        self.assertEqual(bytes(out), b"abc" + bytes(range(256)) + b"xyz\n")
        self.assertEqual(end["status"], "exit status 0")
        # stdin:false -> /dev/null; SendInput fails, CloseStdin succeeds.
        st = self.agent.stream(START, {"process": {"cmd": "/bin/sh", "args": ["-c", "cat; sleep 0.5"]},
                                       "stdin": False})
        it = st.frames()
        pid = next(it)["event"]["start"]["pid"]
        code, body = self.agent.unary("process.Process/SendInput",
                                      {"process": {"pid": pid}, "input": {"stdin": b64(b"x")}})
        self.assertEqual(code, 500)
        self.assertEqual(body["code"], "internal")
        self.assertEqual(self.agent.unary("process.Process/CloseStdin", {"process": {"pid": pid}}), (200, {}))
        list(it)

    def test_signal_kill(self):
        st = self.agent.stream(START, {"process": {"cmd": "/bin/sleep", "args": ["100"]}, "tag": "sleeper"})
        it = st.frames()
        pid = next(it)["event"]["start"]["pid"]
        code, lst = self.agent.unary("process.Process/List", {})
        mine = [p for p in lst["processes"] if p["pid"] == pid]
        self.assertEqual(len(mine), 1)
        self.assertEqual(mine[0]["tag"], "sleeper")
        self.assertEqual(mine[0]["config"]["cmd"], "/bin/sleep")
        self.assertEqual(mine[0]["config"]["args"], ["100"])
        code, body = self.agent.unary("process.Process/SendSignal",
                                      {"process": {"tag": "sleeper"}, "signal": "SIGNAL_SIGKILL"})
        self.assertEqual((code, body), (200, {}))
        end = None
        for f in it:
            end = f["event"].get("end", end)
        self.assertEqual(end, {"exitCode": -1, "status": "signal: killed", "error": "signal: killed"})
        self.assertEqual(st.end, {})
        self.assertFalse(pid_alive(pid))
        # Unknown pid: not_found (the SDK's kill() returns false on it).
        code, body = self.agent.unary("process.Process/SendSignal",
                                      {"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"})
        self.assertEqual(code, 404)
        self.assertEqual(body["code"], "not_found")

    def test_reattach_and_resume(self):
        # The process prints lines over ~1.5 s; the first stream is closed
        # after the first line, the process must live on.
        script = "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.25; done"
        st = start_sh(self.agent, script)
        it = st.frames()
        pid = next(it)["event"]["start"]["pid"]
        got = bytearray()
        for f in it:
            if "data" in f["event"]:
                got += base64.b64decode(f["event"]["data"]["stdout"])
                break
        st.close()  # the client goes away
        time.sleep(0.3)
        self.assertTrue(pid_alive(pid), "closing the stream must not kill the process")
        # Resume from what we had: the rest arrives exactly once.
        c = self.agent.stream(CONNECT, {"process": {"pid": pid}, "outputOffset": str(len(got))})
        start, out, _, end, eos, _ = collect_process(c)
        self.assertEqual(start["pid"], pid)
        self.assertEqual(start["outputOffset"], str(len(got)))
        self.assertEqual(bytes(got) + out, b"".join(b"line%d\n" % i for i in range(1, 7)))
        self.assertEqual(end["status"], "exit status 0")
        # After exit the record is kept: Connect gives start + end; from 0 the
        # whole output again.
        c = self.agent.stream(CONNECT, {"process": {"pid": pid}, "outputOffset": 0})
        _, out2, _, end2, _, _ = collect_process(c)
        self.assertEqual(out2, b"".join(b"line%d\n" % i for i in range(1, 7)))
        self.assertEqual(end2["status"], "exit status 0")
        c = self.agent.stream(CONNECT, {"process": {"pid": pid}})
        _, out3, _, end3, _, _ = collect_process(c)
        self.assertEqual(out3, b"")
        self.assertEqual(end3["status"], "exit status 0")
        # An offset past the end is out_of_range.
        c = self.agent.stream(CONNECT, {"process": {"pid": pid}, "outputOffset": 10 ** 9})
        self.assertEqual(list(c.frames()), [])
        self.assertEqual(c.end["error"]["code"], "out_of_range")

    def test_connect_timeout_kills(self):
        t0 = time.time()
        st = self.agent.stream(START, {"process": {"cmd": "/bin/sleep", "args": ["30"]}},
                               headers={"Connect-Timeout-Ms": "700"})
        start, _, _, end, eos, _ = collect_process(st)
        self.assertLess(time.time() - t0, 20)
        self.assertEqual(end["status"], "signal: killed")
        self.assertEqual(eos["error"]["code"], "deadline_exceeded")
        self.assertFalse(pid_alive(start["pid"]))

    def test_keepalive(self):
        st = self.agent.stream(START, {"process": {"cmd": "/bin/sleep", "args": ["2.5"]}},
                               headers={"Keepalive-Ping-Interval": "1"})
        _, _, _, end, _, frames = collect_process(st)
        kinds = [list(f["event"].keys())[0] for f in frames]
        self.assertEqual(kinds[0], "start")
        self.assertGreaterEqual(kinds.count("keepalive"), 1)
        self.assertEqual(kinds[-1], "end")

    def test_h2c(self):
        # The same Start stream and a unary call over HTTP/2 (prior knowledge).
        body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "head -c 300000 /dev/zero; echo done"]}}).encode()
        env = bytes([0]) + len(body).to_bytes(4, "big") + body
        base = ["curl", "-sS", "--http2-prior-knowledge", "--max-time", "60", "-H",
                "X-Access-Token: " + self.agent.token, "-w", "\n%{http_version}"]
        cp = osrtest.sh(base + ["-H", "Content-Type: application/connect+json", "--data-binary", "@-",
                                "http://127.0.0.1:%d/%s" % (self.agent.port, START)], input=env)
        raw, _, ver = cp.stdout.rpartition(b"\n")
        self.assertEqual(ver, b"2")
        i, n, frames = 0, 0, []
        while i < len(raw):
            flags, ln = raw[i], int.from_bytes(raw[i + 1:i + 5], "big")
            frames.append((flags, json.loads(raw[i + 5:i + 5 + ln])))
            i += 5 + ln
            ev = frames[-1][1].get("event", {})
            if "data" in ev:
                n += len(base64.b64decode(ev["data"]["stdout"]))
        self.assertIn("start", frames[0][1]["event"])
        self.assertEqual(n, 300005)
        self.assertEqual(frames[-1], (2, {}))
        cp = osrtest.sh(base + ["-H", "Content-Type: application/json", "-d", "{}",
                                "http://127.0.0.1:%d/process.Process/List" % self.agent.port])
        self.assertTrue(cp.stdout.endswith(b"\n2"))
        self.assertIn(b'"processes"', cp.stdout)

    def test_pty(self):
        st = self.agent.stream(START, {"process": {"cmd": "/bin/sh", "args": ["-c", "stty size; tty"]},
                                       "pty": {"size": {"cols": 100, "rows": 30}}})
        frames = list(st.frames())
        out = b"".join(base64.b64decode(f["event"]["data"]["pty"]) for f in frames if "data" in f["event"])
        self.assertIn(b"30 100", out)
        self.assertIn(b"/dev/pts/", out)


class BigOutput(unittest.TestCase):
    """100 MB of output through one stream: every byte arrives in order and
    the agent's memory stays bounded (the ring and one frame queue)."""

    def test_100mb(self):
        with Agent() as agent:
            n = 100 * 1000 * 1000
            rss0 = agent.proc.rss_kib()
            # A deterministic, non-repeating-at-small-scale stream.
            script = "head -c %d /dev/urandom | tee /dev/fd/3 3>&1 >/dev/null | cat" % n
            script = "i=0; while [ $i -lt 100 ]; do seq -w 1 142858 | head -c 1000000; i=$((i+1)); done"
            st = start_sh(agent, script)
            h = hashlib.sha256()
            total = 0
            peak = 0
            slow = 0
            for f in st.frames():
                ev = f["event"]
                if "data" in ev:
                    b = base64.b64decode(ev["data"]["stdout"])
                    h.update(b)
                    total += len(b)
                    self.assertLessEqual(len(b), 32 * 1024)
                    if total > slow * 10 * 1000 * 1000:
                        # Be a slow client now and then: backpressure, not buffering.
                        slow += 1
                        time.sleep(0.2)
                        peak = max(peak, agent.proc.rss_kib())
                if "end" in ev:
                    self.assertEqual(ev["end"]["status"], "exit status 0")
            st.close()
            one = subprocess.run(["sh", "-c", "seq -w 1 142858 | head -c 1000000"], stdout=subprocess.PIPE).stdout
            self.assertEqual(total, n)
            exp = hashlib.sha256()
            for _ in range(100):
                exp.update(one)
            self.assertEqual(h.hexdigest(), exp.hexdigest())
            # Bounded: 1 MiB ring + frame queues; allow sanitizer overhead.
            self.assertLess(peak - rss0, 48 * 1024, "agent RSS grew by %d KiB" % (peak - rss0))


class Auth(unittest.TestCase):
    def test_token(self):
        with Agent() as agent:
            marker = os.path.join(agent.dir, "must-not-exist")
            for tok in (False, "wrong-token", agent.token + "x", agent.token[:-1]):
                st = agent.stream(START, {"process": {"cmd": "/bin/touch", "args": [marker]}}, token=tok)
                self.assertEqual(st.status, 401)
                body = json.loads(st.resp.read())
                self.assertEqual(body["code"], "unauthenticated")
                st.close()
                r, data = agent.http("GET", "/files?path=/etc/hostname", token=tok)
                self.assertEqual(r.status, 401)
                self.assertEqual(json.loads(data)["code"], 401)
                code, _ = agent.unary("process.Process/List", {}, token=tok, unix=True)
                self.assertEqual(code, 401)
            time.sleep(0.3)
            self.assertFalse(os.path.exists(marker))
            # /health is open.
            r, _ = agent.http("GET", "/health", token=False)
            self.assertEqual(r.status, 204)
            # The right token works; the token is not in the child's env.
            _, out, _, _, _, _ = collect_process(start_sh(agent, "env"))
            self.assertNotIn(agent.token.encode(), out)

    def init(self, agent, body, token=True):
        r, data = agent.http("POST", "/init", body=json.dumps(body).encode(), token=token,
                             headers={"Content-Type": "application/json"})
        return r.status, data

    def test_init(self):
        """POST /init (envd's orchestrator call): only with the current token,
        swaps the token atomically, merges envVars, sets the default user and
        workdir, ignores an older timestamp."""
        with Agent(extra=["--env", "KEEP=1", "--env", "A=old"]) as agent:
            old = agent.token
            # Refused without/with a wrong token; nothing changes.
            self.assertEqual(self.init(agent, {"accessToken": "evil"}, token=False)[0], 401)
            self.assertEqual(self.init(agent, {"accessToken": "evil"}, token="nope")[0], 401)
            self.assertEqual(agent.unary("process.Process/List", {})[0], 200)
            # Bad bodies: 400 and nothing applied.
            for bad in ({"accessToken": ""}, {"accessToken": 5}, {"envVars": {"A=B": "x"}},
                        {"envVars": ["x"]}, {"timestamp": "yesterday"}, {"defaultWorkdir": "rel"},
                        {"accessToken": "t2", "envVars": {"X": 1}}):
                self.assertEqual(self.init(agent, bad)[0], 400, bad)
            r, data = agent.http("POST", "/init", body=b"{nope", headers={"Content-Type": "application/json"})
            self.assertEqual(r.status, 400)
            self.assertEqual(agent.unary("process.Process/List", {})[0], 200)
            r, _ = agent.http("GET", "/init")
            self.assertEqual(r.status, 405)
            # The swap.
            ws = tempfile.mkdtemp(prefix="osr-init-")
            self.addCleanup(shutil.rmtree, ws, True)
            st, _ = self.init(agent, {"accessToken": "tok-new", "envVars": {"A": "new", "B": "b"},
                                      "defaultWorkdir": ws, "timestamp": "2030-01-02T03:04:05.5Z"})
            self.assertEqual(st, 204)
            self.assertEqual(agent.unary("process.Process/List", {})[0], 401)
            agent.token = "tok-new"
            _, out, _, end, _, _ = collect_process(start_sh(agent, "echo $KEEP $A $B; pwd"))
            self.assertEqual(out, ("1 new b\n%s\n" % ws).encode())
            # An older (or equal) timestamp is acknowledged and ignored ...
            st, _ = self.init(agent, {"accessToken": "tok-old", "timestamp": "2030-01-02T04:04:05+01:00"})
            self.assertEqual(st, 204)
            self.assertEqual(agent.unary("process.Process/List", {})[0], 200)
            # ... a newer one applies; an empty body is fine (envd).
            st, _ = self.init(agent, {"defaultUser": "nobody", "timestamp": "2030-01-02T03:04:06Z"})
            self.assertEqual(st, 204)
            r, _ = agent.http("POST", "/init", body=b"", headers={"Content-Type": "application/json"})
            self.assertEqual(r.status, 204)
            if os.geteuid() == 0:
                # Root agent: the default user applies to requests naming none.
                _, out, _, _, _, _ = collect_process(start_sh(agent, "id -un"))
                self.assertEqual(out, b"nobody\n")
                # A request naming a user still gets that user.
                h = {"Authorization": "Basic " + b64(b"root:")}
                _, out, _, _, _, _ = collect_process(start_sh(agent, "id -un", headers=h))
                self.assertEqual(out, b"root\n")
            self.assertNotEqual(old, agent.token)

    def test_default_user_flag(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to switch users")
        with Agent(extra=["--default-user", "nobody"]) as agent:
            _, out, _, _, _, _ = collect_process(start_sh(agent, "id -un; echo $HOME $USER"))
            self.assertEqual(out, b"nobody\n/nonexistent nobody\n")

    def test_env_token_and_signed_url(self):
        with Agent(token=None, env={"OSR_AGENT_TOKEN": "envtok"}) as agent:
            agent.token = "envtok"
            code, _ = agent.unary("process.Process/List", {}, token=False)
            self.assertEqual(code, 401)
            self.assertEqual(agent.unary("process.Process/List", {})[0], 200)
            p = os.path.join(agent.dir, "signed.txt")
            with open(p, "wb") as f:
                f.write(b"signed!")
            exp = int(time.time()) + 60
            raw = "%s:read::envtok:%d" % (p, exp)
            sig = "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")
            from urllib.parse import quote
            q = "/files?path=%s&signature=%s&signature_expiration=%d" % (quote(p), quote(sig), exp)
            r, data = agent.http("GET", q, token=False)
            self.assertEqual((r.status, data), (200, b"signed!"))
            r, _ = agent.http("GET", q.replace("expiration=%d" % exp, "expiration=%d" % (exp + 1)), token=False)
            self.assertEqual(r.status, 401)


class Filesystem(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.agent = Agent()
        cls.root = tempfile.mkdtemp(prefix="osr-agent-fs-")

    @classmethod
    def tearDownClass(cls):
        cls.agent.stop()
        shutil.rmtree(cls.root, ignore_errors=True)

    def fs(self, m, msg):
        return self.agent.unary("filesystem.Filesystem/" + m, msg)

    def test_ops(self):
        d = os.path.join(self.root, "a", "b")
        code, body = self.fs("MakeDir", {"path": d})
        self.assertEqual(code, 200)
        e = body["entry"]
        self.assertEqual((e["name"], e["type"], e["path"]), ("b", "FILE_TYPE_DIRECTORY", d))
        self.assertEqual(e["permissions"], "drwxr-xr-x")
        self.assertEqual(e["mode"], 0o755)
        code, body = self.fs("MakeDir", {"path": d})
        self.assertEqual((code, body["code"]), (409, "already_exists"))
        with open(os.path.join(d, "f.txt"), "w") as f:
            f.write("12345")
        os.symlink(os.path.join(d, "f.txt"), os.path.join(self.root, "link"))
        code, body = self.fs("Stat", {"path": os.path.join(d, "f.txt")})
        e = body["entry"]
        self.assertEqual((e["type"], e["size"], e["name"]), ("FILE_TYPE_FILE", "5", "f.txt"))
        self.assertRegex(e["modifiedTime"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
        code, body = self.fs("Stat", {"path": os.path.join(self.root, "link")})
        e = body["entry"]
        self.assertEqual(e["type"], "FILE_TYPE_FILE")
        self.assertEqual(e["symlinkTarget"], os.path.join(d, "f.txt"))
        self.assertTrue(e["permissions"].startswith("L"))
        code, body = self.fs("Stat", {"path": os.path.join(self.root, "nope")})
        self.assertEqual((code, body["code"]), (404, "not_found"))
        # ListDir depth 1 and 3.
        code, body = self.fs("ListDir", {"path": self.root, "depth": 1})
        names = sorted(e["name"] for e in body["entries"])
        self.assertEqual(names, ["a", "link"])
        code, body = self.fs("ListDir", {"path": self.root, "depth": 3})
        paths = sorted(e["path"] for e in body["entries"])
        self.assertEqual(paths, sorted([os.path.join(self.root, "a"), d, os.path.join(d, "f.txt"),
                                        os.path.join(self.root, "link")]))
        code, body = self.fs("ListDir", {"path": os.path.join(d, "f.txt")})
        self.assertEqual((code, body["code"]), (400, "invalid_argument"))
        # Move creates the destination's parents.
        dst = os.path.join(self.root, "x", "y", "g.txt")
        code, body = self.fs("Move", {"source": os.path.join(d, "f.txt"), "destination": dst})
        self.assertEqual((code, body["entry"]["path"]), (200, dst))
        self.assertTrue(os.path.exists(dst))
        code, body = self.fs("Move", {"source": os.path.join(d, "f.txt"), "destination": dst})
        self.assertEqual(body["code"], "not_found")
        # Remove: recursive, and a missing path is fine.
        self.assertEqual(self.fs("Remove", {"path": os.path.join(self.root, "x")}), (200, {}))
        self.assertFalse(os.path.exists(os.path.join(self.root, "x")))
        self.assertEqual(self.fs("Remove", {"path": os.path.join(self.root, "x")}), (200, {}))

    def test_watch(self):
        w = os.path.join(self.root, "watched")
        os.makedirs(os.path.join(w, "sub"))
        st = self.agent.stream("filesystem.Filesystem/WatchDir", {"path": w, "recursive": True},
                               timeout=20)
        it = st.frames()
        self.assertEqual(next(it), {"start": {}})
        events = []

        def reader():
            try:
                for f in it:
                    if "filesystem" in f:
                        events.append((f["filesystem"]["name"], f["filesystem"]["type"]))
            except Exception:
                pass
        t = threading.Thread(target=reader, daemon=True)
        t.start()
        time.sleep(0.2)
        with open(os.path.join(w, "new.txt"), "w") as f:
            f.write("x")
        os.chmod(os.path.join(w, "new.txt"), 0o600)
        os.rename(os.path.join(w, "new.txt"), os.path.join(w, "sub", "moved.txt"))
        os.mkdir(os.path.join(w, "sub", "deeper"))
        time.sleep(0.2)
        with open(os.path.join(w, "sub", "deeper", "z"), "w") as f:
            f.write("z")
        os.unlink(os.path.join(w, "sub", "moved.txt"))
        want = [("new.txt", "EVENT_TYPE_CREATE"), ("new.txt", "EVENT_TYPE_WRITE"),
                ("new.txt", "EVENT_TYPE_CHMOD"), ("new.txt", "EVENT_TYPE_RENAME"),
                ("sub/moved.txt", "EVENT_TYPE_CREATE"), ("sub/deeper", "EVENT_TYPE_CREATE"),
                ("sub/deeper/z", "EVENT_TYPE_CREATE"), ("sub/moved.txt", "EVENT_TYPE_REMOVE")]
        wait_for(lambda: all(x in events for x in want), 10, "watch events %r" % (want,))
        st.close()


class Files(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.agent = Agent()
        cls.root = tempfile.mkdtemp(prefix="osr-agent-files-")

    @classmethod
    def tearDownClass(cls):
        cls.agent.stop()
        shutil.rmtree(cls.root, ignore_errors=True)

    def curl(self, *args):
        return osrtest.sh(["curl", "-sS", "--max-time", "120", "-H", "X-Access-Token: " + self.agent.token]
                          + list(args), timeout=150)

    def test_roundtrip_50mb_octet_and_multipart(self):
        src = os.path.join(self.root, "src.bin")
        data = os.urandom(1 << 20) * 50
        with open(src, "wb") as f:
            f.write(data)
        digest = hashlib.sha256(data).hexdigest()
        rss0 = self.agent.proc.rss_kib()
        from urllib.parse import quote
        for mode, name in (("octet", "octet dir/ü n'i\"code.bin"), ("multipart", "multi dir/ä b \"q\".bin")):
            target = os.path.join(self.root, name)
            url = "http://127.0.0.1:%d/files?path=%s" % (self.agent.port, quote(target))
            if mode == "octet":
                cp = self.curl("-X", "POST", "-H", "Content-Type: application/octet-stream",
                               "--data-binary", "@" + src, url)
            else:
                cp = self.curl("-F", "file=@%s;filename=ignored.bin" % src, url)
            body = json.loads(cp.stdout)
            self.assertEqual(body, [{"name": os.path.basename(target), "type": "file", "path": target}])
            with open(target, "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest)
            # Download through unix socket and TCP.
            out = os.path.join(self.root, "dl.bin")
            cp = self.curl("-D", "-", "-o", out, url)
            head = cp.stdout.decode()
            self.assertIn("content-length: %d" % len(data), head.lower())
            self.assertIn("content-disposition: attachment", head.lower())
            with open(out, "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest)
        self.assertLess(self.agent.proc.rss_kib() - rss0, 48 * 1024)

    def test_multi_file_multipart_and_errors(self):
        a = os.path.join(self.root, "m", "one.txt")
        b = os.path.join(self.root, "m", "deep", "two.txt")
        boundary = "----osrBoundary" + os.urandom(4).hex()
        parts = []
        for path, content in ((a, b"first\r\n--not-a-boundary\r\n"), (b, b"\r\n\r\nsecond")):
            parts.append(("--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\"\r\n"
                          "Content-Type: application/octet-stream\r\n\r\n" % (boundary, path)).encode()
                         + content + b"\r\n")
        body = b"".join(parts) + ("--%s--\r\n" % boundary).encode()
        r, data = self.agent.http("POST", "/files", body=body,
                                  headers={"Content-Type": "multipart/form-data; boundary=" + boundary})
        self.assertEqual(r.status, 200, data)
        self.assertEqual([e["path"] for e in json.loads(data)], [a, b])
        with open(a, "rb") as f:
            self.assertEqual(f.read(), b"first\r\n--not-a-boundary\r\n")
        with open(b, "rb") as f:
            self.assertEqual(f.read(), b"\r\n\r\nsecond")
        # Missing file: 404 JSON; directory: 400 JSON.
        r, data = self.agent.http("GET", "/files?path=" + os.path.join(self.root, "nope"))
        self.assertEqual(r.status, 404)
        self.assertEqual(json.loads(data)["code"], 404)
        r, data = self.agent.http("GET", "/files?path=" + self.root, unix=True)
        self.assertEqual(r.status, 400)
        # Empty file.
        r, data = self.agent.http("POST", "/files?path=" + os.path.join(self.root, "empty"), body=b"",
                                  headers={"Content-Type": "application/octet-stream"})
        self.assertEqual(r.status, 200)
        r, data = self.agent.http("GET", "/files?path=" + os.path.join(self.root, "empty"))
        self.assertEqual((r.status, data), (200, b""))


class PortForward(unittest.TestCase):
    def test_http_server_through_agent(self):
        root = tempfile.mkdtemp(prefix="osr-agent-www-")
        blob = os.urandom(3 * 1024 * 1024)
        with open(os.path.join(root, "blob.bin"), "wb") as f:
            f.write(blob)
        srv = osrtest.Proc([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1",
                            "--directory", root])
        try:
            ln = srv.wait_line("Serving HTTP", 10)
            port = int(ln.split("port ")[1].split()[0])
            with Agent() as agent:
                for unix in (False, True):
                    if unix:
                        s = socket.socket(socket.AF_UNIX)
                        s.connect(agent.sock_path)
                    else:
                        s = socket.create_connection(("127.0.0.1", agent.port))
                    s.settimeout(20)
                    # The upgrade and the first tunnelled request in one write.
                    s.sendall(("GET /_osr/ports/%d HTTP/1.1\r\nHost: x\r\nUpgrade: osr-tcp\r\n"
                               "Connection: Upgrade\r\nX-Access-Token: %s\r\n\r\n"
                               "GET /blob.bin HTTP/1.0\r\nHost: x\r\n\r\n" % (port, agent.token)).encode())
                    buf = b""
                    while True:
                        b = s.recv(65536)
                        if not b:
                            break
                        buf += b
                    s.close()
                    head, _, rest = buf.partition(b"\r\n\r\n")
                    self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
                    self.assertIn(b"upgrade: osr-tcp", head.lower())
                    h2, _, payload = rest.partition(b"\r\n\r\n")
                    self.assertTrue(h2.startswith(b"HTTP/1.0 200"), h2[:100])
                    self.assertEqual(payload, blob)
                # A closed port: 502, no upgrade.
                free = socket.socket()
                free.bind(("127.0.0.1", 0))
                fport = free.getsockname()[1]
                free.close()
                out = osrtest.raw_exchange(agent.port, ("GET /_osr/ports/%d HTTP/1.1\r\nHost: x\r\n"
                                                        "Upgrade: osr-tcp\r\nConnection: Upgrade\r\n"
                                                        "X-Access-Token: %s\r\n\r\n" % (fport, agent.token)).encode(),
                                           read_until_close=False)
                self.assertTrue(out.startswith(b"HTTP/1.1 502"), out[:100])
                # Without the token: 401.
                out = osrtest.raw_exchange(agent.port, ("GET /_osr/ports/%d HTTP/1.1\r\nHost: x\r\n"
                                                        "Upgrade: osr-tcp\r\nConnection: Upgrade\r\n\r\n"
                                                        % port).encode(), read_until_close=False)
                self.assertTrue(out.startswith(b"HTTP/1.1 401"), out[:100])
        finally:
            srv.stop()
            shutil.rmtree(root, ignore_errors=True)


class Shutdown(unittest.TestCase):
    def test_sigterm_kills_children(self):
        agent = Agent()
        pids = []
        streams = []
        for _ in range(3):
            st = start_sh(agent, "sleep 100 & sleep 100; wait")
            it = st.frames()
            pids.append(next(it)["event"]["start"]["pid"])
            streams.append(st)
        # The grandchildren are in the same process groups.
        time.sleep(0.3)
        groups = set(pids)
        members = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) in groups]
        self.assertGreaterEqual(len(members), 6)
        rc = agent.stop()
        self.assertEqual(rc, 0, agent.proc.stderr_text())
        wait_for(lambda: not any(pid_alive(p) for p in members), 10, "children to die")
        for st in streams:
            st.close()


class Spawn(unittest.TestCase):
    """src/agent/spawn.c: the clone(CLONE_VM|CLONE_VFORK) spawner, its
    execvp-style search, its errors, the SIGCHLD reaper and --prewarm."""

    @classmethod
    def setUpClass(cls):
        cls.agent = Agent()
        cls.dir = tempfile.mkdtemp(prefix="osr-spawn-")
        os.chmod(cls.dir, 0o755)
        # A script without "#!": execvp hands it to /bin/sh (ENOEXEC).
        with open(os.path.join(cls.dir, "osrviash"), "w") as f:
            f.write("echo via-sh \"$1\"\n")
        os.chmod(os.path.join(cls.dir, "osrviash"), 0o755)
        # Not executable by anyone (EACCES even for root).
        with open(os.path.join(cls.dir, "osrnox"), "w") as f:
            f.write("#!/bin/sh\necho never\n")
        os.chmod(os.path.join(cls.dir, "osrnox"), 0o644)

    @classmethod
    def tearDownClass(cls):
        cls.agent.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def start_error(self, msg):
        st = self.agent.stream(START, msg)
        self.assertEqual(st.status, 200)
        frames = list(st.frames())
        self.assertEqual(frames, [], "no start event for a process that never ran")
        self.assertEqual(st.end["error"]["code"], "internal", st.end)
        return st.end["error"]["message"]

    def test_sched_batch(self):
        # The agent runs SCHED_BATCH (main.c apply_sched) and the processes
        # it starts do not inherit it (spawn.c); --sched normal
        # keeps the default policy.
        def policy(stat):  # field 41 of /proc/PID/stat
            return int(stat.rsplit(")", 1)[1].split()[38])

        with open("/proc/%d/stat" % self.agent.proc.p.pid) as f:
            self.assertEqual(policy(f.read()), os.SCHED_BATCH)
        _, out, _, end, _, _ = collect_process(self.agent.stream(
            START, {"process": {"cmd": "cat", "args": ["/proc/self/stat"]}}))
        self.assertEqual(end.get("exitCode", 0), 0)
        self.assertEqual(policy(out.decode()), os.SCHED_OTHER)
        with Agent(extra=["--sched", "normal"]) as plain:
            with open("/proc/%d/stat" % plain.proc.p.pid) as f:
                self.assertEqual(policy(f.read()), os.SCHED_OTHER)

    def test_path_search(self):
        # No '/': searched in the child's PATH (the request's envs may set it).
        _, out, _, end, _, _ = collect_process(self.agent.stream(
            START, {"process": {"cmd": "echo", "args": ["a b"]}}))
        self.assertEqual((out, end.get("exitCode", 0)), (b"a b\n", 0))
        env = {"PATH": "/nonexistent-dir:" + self.dir}
        _, out, _, end, _, _ = collect_process(self.agent.stream(
            START, {"process": {"cmd": "osrviash", "args": ["x"], "envs": env}}))
        self.assertEqual((out, end.get("exitCode", 0)), (b"via-sh x\n", 0))
        # With a '/': no search, the same ENOEXEC fallback.
        _, out, _, _, _, _ = collect_process(self.agent.stream(
            START, {"process": {"cmd": os.path.join(self.dir, "osrviash"), "args": ["y"]}}))
        self.assertEqual(out, b"via-sh y\n")

    def test_exec_errors_are_start_errors(self):
        m = self.start_error({"process": {"cmd": "osr-no-such-command"}})
        self.assertIn("no such file or directory", m)
        # EACCES wins over a later ENOENT, as in execvp.
        m = self.start_error({"process": {"cmd": "osrnox",
                                          "envs": {"PATH": self.dir + ":/nonexistent-dir"}}})
        self.assertIn("permission denied", m)
        # A pty child is different: it exits 127 (126) with the reason on the
        # terminal, as at a shell prompt.
        for cmd, code, why in (("/nonexistent/cmd", 127, b"No such file or directory"),
                               (os.path.join(self.dir, "osrnox"), 126, b"Permission denied")):
            _, _, _, end, _, frames = collect_process(self.agent.stream(
                START, {"process": {"cmd": cmd}, "pty": {"size": {"cols": 80, "rows": 24}}}))
            text = b"".join(base64.b64decode(f["event"]["data"]["pty"]) for f in frames
                            if "data" in f.get("event", {}))
            self.assertEqual(end.get("exitCode", 0), code, end)
            self.assertIn(b"osr-agent: exec " + cmd.encode() + b": " + why, text)
        # And the agent is fine afterwards: no stray child, no leaked record.
        _, out, _, _, _, _ = collect_process(start_sh(self.agent, "echo ok"))
        self.assertEqual(out, b"ok\n")

    def test_signal_dispositions_reset(self):
        # The agent ignores SIGPIPE; its children must not inherit that
        # (nor a blocked signal mask).
        _, out, _, _, _, _ = collect_process(start_sh(
            self.agent, "grep -E '^(SigIgn|SigBlk)' /proc/self/status"))
        for ln in out.decode().splitlines():
            self.assertEqual(int(ln.split()[1], 16) & (1 << (signal.SIGPIPE - 1)), 0, ln)
        _, out, _, end, _, _ = collect_process(start_sh(self.agent, "yes | head -c 3"))
        self.assertEqual(out, b"y\ny")

    def test_inherited_ignored_signals_not_passed_on(self):
        # An agent started with signals ignored (inherited across exec: a
        # standard one and real-time ones, which the spawn child does not
        # reset itself: start-up puts those back) gives its commands none.
        rt = [signal.SIGRTMIN + 6, signal.SIGRTMAX]
        old = {s: signal.signal(s, signal.SIG_IGN) for s in [signal.SIGHUP] + rt}
        try:
            agent = Agent()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        with agent:
            with open("/proc/%d/status" % agent.proc.p.pid) as f:
                ign = [l for l in f if l.startswith("SigIgn:")][0]
            self.assertNotEqual(int(ign.split()[1], 16) & (1 << (signal.SIGHUP - 1)), 0, ign)
            _, out, _, _, _, _ = collect_process(start_sh(
                agent, "grep -E '^(SigIgn|SigBlk)' /proc/self/status"))
            lines = out.decode().split("\n")[:2]
            self.assertEqual([int(l.split()[1], 16) for l in lines], [0, 0], out)

    def traced_child_calls(self, agent, script, calls):
        """Run `sh -c script` through `agent` under `strace -f` and return
        (the command's pid, [(pid, call, first argument)] of `calls` made by
        the agent and by the spawn child before its execve)."""
        log = os.path.join(self.dir, "strace.%d" % agent.proc.p.pid)
        st = subprocess.Popen(["strace", "-f", "-o", log, "-e", "trace=execve," + ",".join(calls),
                               "-p", str(agent.proc.p.pid)], stderr=subprocess.PIPE, text=True)
        try:
            # "strace: Process N attached", once per thread of the agent.
            self.assertIn("attached", st.stderr.readline())
            time.sleep(0.3)
            start, out, _, end, _, _ = collect_process(start_sh(agent, script))
            self.assertEqual(end.get("exitCode", 0), 0, out)
        finally:
            st.terminate()
            st.wait(30)
        rows, execed = [], set()
        with open(log) as f:
            for ln in f:
                pid, rest = ln.split(None, 1)
                if "(" not in rest or int(pid) in execed:
                    continue
                call, args = rest.split("(", 1)
                if call == "execve":
                    execed.add(int(pid))  # from here on it is the command's
                else:
                    rows.append((int(pid), call, args.split(",")[0].split(")")[0]))
        os.unlink(log)
        return start["pid"], rows

    def test_child_resets_only_what_the_agent_changed(self):
        # The spawn child puts back to the default exactly the signals of
        # 1..33 the agent has a handler for or ignores (spawn.h snapshot),
        # not all 31: in gVisor every system call of the child is a ptrace
        # round trip. Expected set: the agent's own SigCgt | SigIgn (ASan
        # builds add their handlers), started with SIGHUP ignored too.
        if not shutil.which("strace"):
            self.skipTest("strace is not installed")
        old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            agent = Agent()
        finally:
            signal.signal(signal.SIGHUP, old)
        with agent:
            with open("/proc/%d/status" % agent.proc.p.pid) as f:
                st = {ln.split(":")[0]: int(ln.split()[1], 16) for ln in f
                      if ln.startswith(("SigCgt:", "SigIgn:"))}
            mask = (st["SigCgt"] | st["SigIgn"]) & ((1 << 33) - 1)
            want = {s for s in range(1, 34) if mask & (1 << (s - 1))}
            self.assertTrue({signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGHUP} <= want, want)
            pid, rows = self.traced_child_calls(
                agent, "grep -E '^(SigIgn|SigBlk)' /proc/self/status",
                ["rt_sigaction", "sched_getscheduler", "sched_setscheduler"])
            got = {signum(arg) for p, call, arg in rows if p == pid and call == "rt_sigaction"}
            # SIGCHLD got libuv's handler at the first spawn (this one).
            self.assertEqual(got, want | {signal.SIGCHLD}, rows)
            # SCHED_BATCH (the default --sched): one call back to
            # SCHED_OTHER and no query.
            sched = [c for p, c, _ in rows if p == pid and c.startswith("sched_")]
            self.assertEqual(sched, ["sched_setscheduler"], rows)
        with Agent(extra=["--sched", "normal"]) as plain:
            pid, rows = self.traced_child_calls(plain, "true",
                                                ["sched_getscheduler", "sched_setscheduler"])
            self.assertEqual([c for p, c, _ in rows if p == pid], [], rows)

    def test_cwd_checked_by_the_child(self):
        # A Start as the agent's own user spawns without the thread-pool
        # stat of the cwd (process.c start_fast): the spawn child's chdir
        # checks it. Same answers as the stat path, which a Start as
        # another user (here "nobody") still takes: a given cwd that is
        # missing or not a directory is invalid_argument with no process;
        # a default workdir that went away runs the command in "/".
        gone = tempfile.mkdtemp(prefix="osr-wd-")
        os.chmod(gone, 0o755)
        afile = os.path.join(self.dir, "not-a-dir")
        with open(afile, "w") as f:
            f.write("x")
        for extra in ([], ["--default-user", "nobody"]):
            with Agent(extra=["--workdir", gone] + extra) as a:
                for cwd in ("/no/such/dir", afile):
                    st = a.stream(START, {"process": {"cmd": "/bin/true", "cwd": cwd}})
                    self.assertEqual(list(st.frames()), [], (extra, cwd))
                    self.assertEqual(st.end["error"]["code"], "invalid_argument", (extra, st.end))
                    self.assertIn("cwd '%s' does not exist" % cwd, st.end["error"]["message"])
                _, out, _, _, _, _ = collect_process(a.stream(START, {"process": {"cmd": "/bin/pwd"}}))
                self.assertEqual(out, gone.encode() + b"\n", extra)
                os.rmdir(gone)
                try:
                    st = a.stream(START, {"process": {"cmd": "/bin/sh", "args": ["-c", "pwd; sleep 30"]}})
                    it = st.frames()
                    pid = next(it)["event"]["start"]["pid"]
                    self.assertEqual(base64.b64decode(next(it)["event"]["data"]["stdout"]), b"/\n")
                    code, body = a.unary("process.Process/List", {})
                    self.assertEqual(code, 200)
                    procs = {p["pid"]: p for p in body.get("processes", [])}
                    self.assertEqual(procs[pid]["config"]["cwd"], "/", (extra, procs))
                    a.unary("process.Process/SendSignal",
                            {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})
                    st.close()
                finally:
                    os.makedirs(gone, mode=0o755, exist_ok=True)
        os.rmdir(gone)

    def test_many_concurrent(self):
        # 40 at once: every exit reaches its own process (one SIGCHLD may
        # stand for several exits).
        sts = [start_sh(self.agent, "exit %d" % (i % 7)) for i in range(40)]
        codes = [collect_process(st)[3].get("exitCode", 0) for st in sts]
        self.assertEqual(codes, [i % 7 for i in range(40)])

    def test_prewarm(self):
        mark = os.path.join(self.dir, "prewarmed")
        with Agent(extra=["--prewarm", "echo warm > " + mark]) as a:
            # The agent listens only after the command has run.
            with open(mark) as f:
                self.assertEqual(f.read(), "warm\n")
            _, out, _, _, _, _ = collect_process(start_sh(a, "echo after"))
            self.assertEqual(out, b"after\n")
        # A command that never ends is bounded (3 s) and killed.
        t0 = time.time()
        with Agent(extra=["--prewarm", "echo $$ > %s; exec sleep 100" % mark]) as a:
            self.assertLess(time.time() - t0, 30)
            pid = int(open(mark).read())
            wait_for(lambda: not pid_alive(pid), 10, "the prewarm command to be killed")

    def test_reaps_orphans_as_pid1(self):
        # In a gVisor sandbox the agent is pid 1: orphans are re-parented to
        # it and only its waitpid(-1) reaps them. Run it as pid 1 of a pid
        # namespace made here and leave 5 orphans behind.
        wrapper = os.path.join(self.dir, "agent-pid1")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec unshare --pid --fork --kill-child %s \"$@\"\n" % agentlib.AGENT)
        os.chmod(wrapper, 0o755)
        real = agentlib.AGENT
        agentlib.AGENT = wrapper
        try:
            a = Agent()
        finally:
            agentlib.AGENT = real
        try:
            kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == a.proc.p.pid]
            self.assertEqual(len(kids), 1, "unshare's child is the agent")
            agent_pid = kids[0]
            _, out, _, end, _, _ = collect_process(start_sh(
                a, "for i in 1 2 3 4 5; do sleep 1 >/dev/null 2>&1 & done; echo started"))
            self.assertEqual((out, end.get("exitCode", 0)), (b"started\n", 0))

            def zombies():
                return [int(p) for p in os.listdir("/proc") if p.isdigit()
                        and _ppid(int(p)) == agent_pid and _state(int(p)) == "Z"]

            def orphans():
                return [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == agent_pid]
            # The sleeps were re-parented to the agent ...
            self.assertTrue(orphans(), "the orphans were re-parented to the agent")
            # ... and once they exit, none stays a zombie.
            wait_for(lambda: not orphans(), 10, "the orphans to be reaped")
            self.assertEqual(zombies(), [])
        finally:
            a.stop()


def _ppid(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return -1


def _state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return "?"


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1


if __name__ == "__main__":
    osrtest.run()
