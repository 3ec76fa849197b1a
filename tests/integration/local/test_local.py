"""The local provider against real bubblewrap and runsc sandboxes, driven
through the adapter by local_driver, with the real osr-agent inside.

A class whose runtime cannot run on this machine is skipped with the reason
(CI installs both). Every sandbox a test makes is destroyed by the test, and
tearDown checks that none of its processes or directories are left."""
import base64
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "lib"))
import osrtest  # noqa: E402

DRIVER = os.environ.get("OSR_LOCAL_DRIVER", "")
AGENT = os.environ.get("OSR_AGENT") or os.path.join(os.environ.get("OSR_BUILD_ROOT", ""), "src",
                                                    "osr-agent")


def driver_has(word):
    """Whether the local_driver binary knows `word` (its usage text names
    every flag)."""
    try:
        with open(DRIVER, "rb") as f:
            return word in f.read()
    except OSError:
        return False


def runtime_problem(cls):
    """Why `cls` cannot run here, or None."""
    if os.geteuid() != 0:
        return "the local provider tests need root (cgroups, tmpfs mounts, runsc)"
    if cls == "container":
        if not shutil.which("bwrap"):
            return "bwrap is not installed"
        r = subprocess.run(["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink",
                            "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib",
                            "/usr/bin/true"], capture_output=True, timeout=30)
        if r.returncode != 0:
            return "bwrap cannot create namespaces here: %r" % r.stderr[-200:]
    else:
        if not shutil.which("runsc"):
            return "runsc is not installed"
        r = subprocess.run(["runsc", "--platform=ptrace", "--network=none", "do", "/usr/bin/true"],
                           capture_output=True, timeout=60)
        if r.returncode != 0:
            return "runsc cannot run here: %r" % r.stderr[-300:]
    return None


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class Sandbox:
    def __init__(self, res, token):
        self.res = res
        self.id = res["provider_id"]
        self.sock = res["agent_endpoint"][len("unix:"):]
        self.token = token

    def start(self, cmd, stdin=None, timeout=120):
        """Run `sh -c cmd` through the agent (process.Process/Start);
        returns (exit_code, stdout, stderr). `stdin` bytes are sent with
        SendInput then CloseStdin."""
        c = UnixHTTP(self.sock, timeout=timeout)
        msg = {"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}, "stdin": stdin is not None}
        body = json.dumps(msg).encode()
        c.request("POST", "/process.Process/Start", body=struct.pack(">BI", 0, len(body)) + body,
                  headers={"Content-Type": "application/connect+json",
                           "Connect-Protocol-Version": "1", **self.auth()})
        r = c.getresponse()
        if r.status != 200:
            raise AssertionError("Start: HTTP %d %r" % (r.status, r.read()))
        out, err, end = bytearray(), bytearray(), None
        while True:
            hdr = r.read(5)
            if len(hdr) < 5:
                break
            flags, n = struct.unpack(">BI", hdr)
            m = json.loads(r.read(n)) if n else {}
            if flags & 2:
                break
            ev = m.get("event", {})
            if "start" in ev and stdin is not None:
                pid = ev["start"]["pid"]
                self.unary("process.Process/SendInput",
                           {"process": {"pid": pid}, "input": {"stdin": base64.b64encode(stdin).decode()}})
                self.unary("process.Process/CloseStdin", {"process": {"pid": pid}})
            if "data" in ev:
                out += base64.b64decode(ev["data"].get("stdout", ""))
                err += base64.b64decode(ev["data"].get("stderr", ""))
            if "end" in ev:
                end = ev["end"]
        c.close()
        if end is None:
            raise AssertionError("no end event; stderr %r" % bytes(err))
        return end.get("exitCode", 0), bytes(out), bytes(err)

    def auth(self):
        return {"X-Access-Token": self.token} if self.token else {}

    def unary(self, method, msg):
        c = UnixHTTP(self.sock)
        c.request("POST", "/" + method, body=json.dumps(msg).encode(),
                  headers={"Content-Type": "application/json", **self.auth()})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def port(self, port, payload):
        """Open /_osr/ports/{port} (Upgrade: osr-tcp), send payload, read to EOF."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(self.sock)
        s.sendall(("GET /_osr/ports/%d HTTP/1.1\r\nHost: agent\r\nUpgrade: osr-tcp\r\n"
                   "Connection: Upgrade\r\nX-Access-Token: %s\r\n\r\n" % (port, self.token)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            b = s.recv(1)
            if not b:
                break
            head += b
        if not head.startswith(b"HTTP/1.1 101"):
            s.close()
            raise AssertionError("port upgrade: %r" % head)
        s.sendall(payload)
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        s.close()
        return data


class Driver:
    """local_driver in its own process: JSON commands in, JSON answers out."""

    def __init__(self, state_dir, stderr=None, pid1=False, destroy_at_exit=False, **cfg):
        """pid1: run the driver as PID 1 of new pid and mount namespaces (as
        a gateway that is a container's entry point): every orphan of its
        runtimes is then its own to reap, and nobody else reaps them.
        destroy_at_exit: at "exit" or EOF on its stdin (this process died)
        the driver destroys every sandbox of state_dir before it exits."""
        c = {"state_dir": state_dir, "agent_path": AGENT}
        c.update(cfg)
        pre = ["unshare", "--pid", "--fork", "--mount", "--mount-proc", "--"] if pid1 else []
        # Its own session: a Ctrl-C (or a signal to the bench's process
        # group) must not kill the driver before the sandboxes it made are
        # destroyed (bench/tti_bench.py cleans up through it).
        # An older local_driver (a base build in an A/B) lacks the flag.
        post = ["--destroy-at-exit"] if destroy_at_exit and driver_has(b"--destroy-at-exit") else []
        self.p = subprocess.Popen(pre + [DRIVER, json.dumps(c)] + post, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=stderr or sys.stderr, text=True,
                                  start_new_session=True)
        self.pid1 = pid1
        self.answers = {}
        self.cv = threading.Condition()
        self.tag = 0
        # send() is called from many threads at once (bench/tti_bench.py's
        # bursts): the tag and the line written to stdin are one unit.
        self.send_lock = threading.Lock()
        self.t = threading.Thread(target=self._pump, daemon=True)
        self.t.start()

    def _pump(self):
        for line in self.p.stdout:
            a = json.loads(line)
            with self.cv:
                self.answers[a["tag"]] = a
                self.cv.notify_all()

    def send(self, op, **kw):
        with self.send_lock:
            self.tag += 1
            tag = self.tag
            kw.update(op=op, tag=tag)
            self.p.stdin.write(json.dumps(kw) + "\n")
            self.p.stdin.flush()
        return tag

    def wait(self, tag, timeout=120):
        deadline = time.time() + timeout
        with self.cv:
            while tag not in self.answers:
                left = deadline - time.time()
                if left <= 0 or self.p.poll() is not None and tag not in self.answers:
                    raise AssertionError("no answer to command %d" % tag)
                self.cv.wait(min(left, 0.5))
            return self.answers.pop(tag)

    def pid(self):
        """The driver's own pid (with pid1, the child of unshare)."""
        if not self.pid1:
            return self.p.pid
        kids = children(self.p.pid)
        return kids[0] if kids else self.p.pid

    def call(self, op, timeout=120, **kw):
        return self.wait(self.send(op, **kw), timeout)

    def hangup(self, timeout=600):
        """Close the driver's stdin (as if this process had died) and wait
        for it to exit: with destroy_at_exit it first destroys everything."""
        try:
            self.p.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()

    def close(self):
        if self.p.poll() is None:
            try:
                self.call("exit", timeout=60)
            except (AssertionError, BrokenPipeError):
                pass
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def children(pid):
    """The pids of pid's children."""
    out = []
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def zombies(pid):
    """The children of pid that are zombies (exited, not yet waited for)."""
    z = []
    for c in children(pid):
        try:
            with open("/proc/%d/stat" % c) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    z.append(c)
        except OSError:
            pass
    return z


def pids_of(pid_list):
    """The pids of the list that are still live processes (a zombie is dead:
    only its parent's wait is pending)."""
    live = []
    for p in pid_list:
        try:
            with open("/proc/%d/stat" % p) as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    live.append(p)
        except OSError:
            pass
    return live


class Base(unittest.TestCase):
    CLASS = "container"

    def setUp(self):
        if not DRIVER or not os.path.exists(DRIVER):
            self.fail("OSR_LOCAL_DRIVER is not built")
        if not os.path.exists(AGENT):
            self.skipTest("osr-agent is not built at %s" % AGENT)
        self.need_class(self.CLASS)
        # The state dir must be traversable by the sandbox uids (o+x).
        self.state = tempfile.mkdtemp(prefix="osr-local-", dir="/tmp")
        os.chmod(self.state, 0o711)
        self.drivers = []
        self.made = []

    def need_class(self, cls):
        """Skip the test when `cls` cannot run here."""
        why = runtime_problem(cls)
        if why:
            self.skipTest("%s class: %s" % (cls, why))

    def driver(self, **cfg):
        d = Driver(self.state, **cfg)
        self.drivers.append(d)
        return d

    def create(self, d, cls=None, **kw):
        tok = "tok-" + os.urandom(8).hex()
        kw.setdefault("sandbox_id", "sbx-" + os.urandom(4).hex())
        a = d.call("create", **{"class": cls or self.CLASS, "token": tok}, **kw)
        self.assertEqual(a["status"], "ok", a)
        sb = Sandbox(a["resource"], tok)
        self.made.append(sb.id)
        return sb

    def tearDown(self):
        for d in getattr(self, "drivers", []):
            d.close()
        if not hasattr(self, "state"):
            return
        # Anything still there is a leak: destroy it through a fresh driver,
        # then fail the test.
        left = [n for n in os.listdir(self.state) if n.startswith("l")]
        if left:
            d = Driver(self.state)
            d.call("list")
            for n in left:
                d.call("destroy", provider_id=n)
            d.close()
        for n in self.made:
            for ctrl in ("memory", "pids", "freezer", "cpu"):
                self.assertFalse(os.path.exists("/sys/fs/cgroup/%s/osr/%s" % (ctrl, n)),
                                 "cgroup %s/%s left behind" % (ctrl, n))
        shutil.rmtree(self.state, ignore_errors=True)
        self.assertEqual(left, [], "sandboxes leaked")


class ExecMixin:
    def test_exec_through_agent(self):
        d = self.driver()
        sb = self.create(d, env={"FOO": "bar"})
        code, out, _ = sb.start("id -un; hostname; echo $HOME; pwd; echo $FOO")
        self.assertEqual(code, 0)
        # The create's env reaches every process (envd's envVars).
        self.assertEqual(out.split(), [b"user", b"sandbox", b"/home/user", b"/home/user", b"bar"])
        # Binary-safe output: every byte value, twice.
        code, out, _ = sb.start("python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256))*2)'")
        self.assertEqual((code, out), (0, bytes(range(256)) * 2))
        # Exit codes and stderr.
        code, out, err = sb.start("echo oops >&2; exit 42")
        self.assertEqual((code, err), (42, b"oops\n"))
        # stdin.
        code, out, _ = sb.start("cat", stdin=b"hello\x00world\n")
        self.assertEqual((code, out), (0, b"hello\x00world\n"))
        # The sandbox sees no host paths but /usr.
        code, out, _ = sb.start("ls /; test -e /work || test -e /root; echo $?")
        self.assertNotIn(b"work", out.split()[:-1])
        # A wrong token is refused.
        bad = Sandbox(sb.res, "nope")
        st, _ = bad.unary("process.Process/List", {})
        self.assertEqual(st, 401)
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")
        self.assertFalse(os.path.exists(os.path.join(self.state, sb.id)))

    def test_port_through_agent(self):
        d = self.driver()
        sb = self.create(d)
        # A server inside the sandbox, on the sandbox's own loopback.
        srv = threading.Thread(target=sb.start, args=(
            "cd /tmp && echo inside > f.txt && timeout 60 python3 -m http.server 8765 --bind 127.0.0.1",),
            daemon=True)
        srv.start()
        data = b""
        for _ in range(100):
            try:
                data = sb.port(8765, b"GET /f.txt HTTP/1.0\r\n\r\n")
                if b"inside" in data:
                    break
            except (AssertionError, OSError):
                pass
            time.sleep(0.1)
        self.assertIn(b"200", data.split(b"\r\n")[0])
        self.assertTrue(data.endswith(b"inside\n"), data[-100:])
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")


class Container(ExecMixin, Base):
    CLASS = "container"

    def test_isolation_settings(self):
        d = self.driver()
        sb = self.create(d)
        code, out, _ = sb.start("grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status")
        self.assertEqual(code, 0)
        f = dict(l.split(b":\t") for l in out.strip().split(b"\n"))
        self.assertEqual(f[b"CapEff"], b"0000000000000000")
        self.assertEqual(f[b"NoNewPrivs"], b"1")
        self.assertEqual(f[b"Seccomp"], b"2")
        # The seccomp denylist: no keyring, no new user namespace, no mount.
        code, out, _ = sb.start("unshare -U true; echo rc=$?; python3 -c 'import ctypes,os;"
                                "l=ctypes.CDLL(None,use_errno=True);"
                                "print(l.syscall(250,0,0,0,0,0), ctypes.get_errno())'")
        self.assertIn(b"rc=1", out)
        self.assertIn(b"-1 1", out)  # keyctl → EPERM
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")


class Gvisor(ExecMixin, Base):
    CLASS = "gvisor"

    def test_host_etc_read_only(self):
        # /etc/ssl, /etc/alternatives, /etc/ld.so.cache: the host's, read-only
        # (host bind mounts inside rw/etc, seen through the /etc volume);
        # the rest of /etc is the sandbox's own and writable.
        d = self.driver()
        sb = self.create(d)
        code, out, err = sb.start("test -d /etc/ssl/certs && test -s /etc/ld.so.cache && "
                                  "test -e /etc/alternatives && echo seen; "
                                  "touch /etc/ssl/x 2>/dev/null || echo ro1; "
                                  "echo x > /etc/ld.so.cache 2>/dev/null || echo ro2; "
                                  "echo y > /etc/mine && cat /etc/mine")
        self.assertEqual((code, out), (0, b"seen\nro1\nro2\ny\n"), err)
        self.assertFalse(os.path.exists("/etc/ssl/x"))
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")
        self.assertEqual([m for m in open("/proc/self/mounts").read().splitlines() if sb.id in m], [])

    def test_gvisor_destroy_reaps(self):
        # Not PID 1: the driver is the orphans' subreaper; nothing of a
        # destroyed sandbox is left, not even a zombie.
        d = self.driver()
        sb = self.create(d)
        with open(os.path.join(self.state, sb.id, "runsc.pid")) as f:
            sandbox_pid = int(f.read())
        self.assertIn(sandbox_pid, children(d.pid()), "the sandbox is not the driver's child")
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")
        self.assertEqual(pids_of([sandbox_pid]), [])
        for _ in range(200):
            if not zombies(d.pid()):
                break
            time.sleep(0.05)
        self.assertEqual(zombies(d.pid()), [])

    def test_kernel_is_gvisor(self):
        d = self.driver()
        sb = self.create(d)
        code, out, _ = sb.start("dmesg 2>/dev/null | head -1; uname -r")
        self.assertEqual(code, 0)
        self.assertIn(b"gVisor", out)
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")

    def test_usr_is_in_the_read_only_root(self):
        # /usr is bound into the bundle's rootfs on the host (cached by the
        # sentry as part of the root mount), not a runsc bind mount: no
        # mount of its own inside, read-only, the host's files.
        d = self.driver()
        sb = self.create(d)
        mnt = os.path.join(self.state, sb.id, "rootfs", "usr")
        with open("/proc/self/mountinfo") as f:
            self.assertIn(" %s " % mnt, f.read())
        code, out, _ = sb.start("awk '{print $2}' /proc/mounts; touch /usr/x 2>/dev/null; "
                                "echo touch=$?; test -x /usr/bin/python3 && echo py; "
                                "touch /tmp/y && echo tmp-ok")
        self.assertEqual(code, 0)
        lines = out.split()
        self.assertIn(b"/", lines)
        self.assertNotIn(b"/usr", lines)
        self.assertIn(b"touch=1", lines)
        self.assertIn(b"py", lines)
        self.assertIn(b"tmp-ok", lines)
        self.assertFalse(os.path.exists("/usr/x"))
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")
        with open("/proc/self/mountinfo") as f:
            self.assertNotIn(os.path.join(self.state, sb.id), f.read())
        self.assertTrue(os.path.exists("/usr/bin/python3"))  # the host's /usr is untouched


class Lifecycle(Base):
    CLASS = "container"

    def test_ttl_kill(self):
        d = self.driver()
        sb = self.create(d, timeout_s=2)
        pid_dir = os.path.join(self.state, sb.id)
        self.assertTrue(os.path.isdir(pid_dir))
        for _ in range(200):
            if not os.path.exists(pid_dir):
                break
            time.sleep(0.1)
        self.assertFalse(os.path.exists(pid_dir), "TTL did not destroy the sandbox")
        self.assertEqual(d.call("get", provider_id=sb.id)["status"], "not_found")
        self.made.remove(sb.id)
        self.made.append(sb.id)

    def test_pause_resume(self):
        d = self.driver()
        sb = self.create(d)
        self.assertEqual(d.call("pause", provider_id=sb.id)["status"], "ok")
        with open("/sys/fs/cgroup/freezer/osr/%s/freezer.state" % sb.id) as f:
            self.assertEqual(f.read().strip(), "FROZEN")
        self.assertEqual(d.call("get", provider_id=sb.id)["resource"]["state"], "paused")
        a = d.call("resume", provider_id=sb.id)
        self.assertEqual(a["status"], "ok")
        self.assertEqual(a["resource"]["state"], "running")
        self.assertEqual(sb.start("echo back")[1], b"back\n")
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")

    def test_snapshot_restore(self):
        self.snapshot_restore("container")

    def test_snapshot_restore_gvisor(self):
        # gVisor binds the host's read-only /etc parts inside rw/etc: the
        # snapshot leaves them out and the restored sandbox has them again.
        self.need_class("gvisor")
        self.snapshot_restore("gvisor")

    def snapshot_restore(self, cls):
        d = self.driver()
        sb = self.create(d, cls=cls)
        self.assertEqual(sb.start("echo kept > /home/user/note; mkdir -p /tmp/x; echo t > /tmp/x/y")[0], 0)
        snap = os.path.join(self.state, "snap.tar")
        a = d.call("snapshot", provider_id=sb.id, path=snap)
        self.assertEqual(a["status"], "ok", a)
        self.assertTrue(os.path.getsize(snap) > 0)
        names = subprocess.run(["tar", "-tf", snap], capture_output=True, text=True).stdout.split()
        self.assertIn("./home/user/note", names)
        self.assertEqual([n for n in names if n.startswith(("./etc/ssl", "./etc/ld.so.cache"))], [])
        tok = "tok-" + os.urandom(8).hex()
        a = d.call("restore", **{"class": cls, "sandbox_id": "restored", "token": tok,
                                 "path": snap})
        self.assertEqual(a["status"], "ok", a)
        sb2 = Sandbox(a["resource"], tok)
        self.made.append(sb2.id)
        code, out, _ = sb2.start("cat /home/user/note /tmp/x/y; echo more >> /home/user/note")
        self.assertEqual((code, out), (0, b"kept\nt\n"))
        for s in (sb, sb2):
            self.assertEqual(d.call("destroy", provider_id=s.id)["status"], "ok")
        os.unlink(snap)

    def test_bad_requests(self):
        d = self.driver()
        a = d.call("create", **{"class": "container", "sandbox_id": "x", "memory_mib": 1 << 20})
        self.assertEqual(a["status"], "invalid")
        a = d.call("create", **{"class": "firecracker", "sandbox_id": "x"})
        self.assertEqual(a["status"], "invalid")
        self.assertEqual(d.call("get", provider_id="lnope")["status"], "not_found")
        self.assertEqual(d.call("destroy", provider_id="lnope")["status"], "not_found")
        desc = d.call("describe")
        self.assertNotIn("firecracker", desc["classes"])


class Limits(Base):
    CLASS = "container"

    def test_memory_hog_killed(self):
        d = self.driver()
        sb = self.create(d, memory_mib=128)
        code, out, err = sb.start("python3 -c 'b=[]\nwhile True: b.append(bytearray(16<<20))'")
        self.assertEqual(code, 137, err)  # SIGKILL from the cgroup's OOM killer
        with open("/sys/fs/cgroup/memory/osr/%s/memory.max_usage_in_bytes" % sb.id) as f:
            self.assertGreaterEqual(int(f.read()), 120 << 20)
        # The sandbox (and its agent) survive the OOM kill of the hog.
        self.assertEqual(sb.start("echo alive")[1], b"alive\n")
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")

    def test_fork_bomb_contained(self):
        d = self.driver(pids_max=64)
        sb = self.create(d)
        other = self.create(d)
        sb.start("(f(){ f | f & }; f) >/dev/null 2>&1 & sleep 3; echo done", timeout=60)
        with open("/sys/fs/cgroup/pids/osr/%s/pids.current" % sb.id) as f:
            self.assertLessEqual(int(f.read()), 64)
        # Another sandbox and the host still work.
        self.assertEqual(other.start("echo ok")[1], b"ok\n")
        self.assertEqual(subprocess.run(["true"], timeout=30).returncode, 0)
        pids = [int(p) for p in open("/sys/fs/cgroup/pids/osr/%s/cgroup.procs" % sb.id).read().split()]
        self.assertEqual(d.call("destroy", provider_id=sb.id, timeout=120)["status"], "ok")
        for _ in range(100):
            if not pids_of(pids):
                break
            time.sleep(0.1)
        self.assertEqual(pids_of(pids), [])
        self.assertEqual(d.call("destroy", provider_id=other.id)["status"], "ok")


class Egress(Base):
    CLASS = "container"
    PROBE = ("python3 -c 'import socket,sys\n"
             "for h,p in [(\"127.0.0.1\",%d),(\"169.254.169.254\",80),(\"192.0.2.1\",80),(\"127.0.0.1\",%d)]:\n"
             "  s=socket.socket(); s.settimeout(3)\n"
             "  try: s.connect((h,p)); print(\"OPEN\",h,p)\n"
             "  except OSError as e: print(\"blocked\",h,p)\n'")

    def run_probe(self, cls):
        d = self.driver()
        # A host loopback service (what the gateway, Redis or PostgreSQL are).
        host = socket.socket()
        host.bind(("127.0.0.1", 0))
        host.listen(8)
        host.setblocking(False)
        hport = host.getsockname()[1]
        sib = self.create(d, cls=cls)
        threading.Thread(target=sib.start, args=("timeout 30 python3 -m http.server 8766 --bind 127.0.0.1",),
                         daemon=True).start()
        for _ in range(100):  # the sibling's server is up (seen from inside the sibling)
            try:
                if b"200" in sib.port(8766, b"GET / HTTP/1.0\r\n\r\n")[:20]:
                    break
            except (AssertionError, OSError):
                pass
            time.sleep(0.1)
        sb = self.create(d, cls=cls)
        code, out, err = sb.start(self.PROBE % (hport, 8766), timeout=60)
        self.assertEqual(code, 0, err)
        self.assertNotIn(b"OPEN", out)
        self.assertEqual(out.count(b"blocked"), 4, out)
        try:
            host.accept()
            self.fail("the host service saw a connection from the sandbox")
        except BlockingIOError:
            pass
        host.close()
        # Only lo inside.
        code, out, _ = sb.start("cat /proc/net/dev | tail -n +3 | cut -d: -f1")
        self.assertEqual(out.split(), [b"lo"])
        for s in (sb, sib):
            self.assertEqual(d.call("destroy", provider_id=s.id)["status"], "ok")

    def test_container_egress_blocked(self):
        self.run_probe("container")

    def test_gvisor_egress_blocked(self):
        self.need_class("gvisor")
        self.run_probe("gvisor")


class Restart(Base):
    CLASS = "container"

    def test_restart_lists_everything_and_nothing_leaks(self):
        classes = ["container"] + ([] if runtime_problem("gvisor") else ["gvisor"])
        d = self.driver()
        made = [self.create(d, cls=c) for c in classes for _ in range(2)]
        d.close()  # the "gateway" goes away; sandboxes keep running
        pids = {}
        for sb in made:
            with open(os.path.join(self.state, sb.id, "meta.json")) as f:
                pids[sb.id] = json.load(f)["pid"]
            self.assertTrue(os.path.exists("/proc/%d" % pids[sb.id]))
            self.assertEqual(sb.start("echo still")[1], b"still\n")
        d2 = self.driver()
        a = d2.call("list")
        self.assertEqual(a["status"], "ok")
        found = {r["provider_id"]: r for r in a["resources"]}
        for sb in made:
            self.assertIn(sb.id, found)
            self.assertEqual(found[sb.id]["state"], "running")
            self.assertEqual(found[sb.id]["sandbox_id"], sb.res["sandbox_id"])
        # Each destroy runs with lists in flight (the gateway lists while
        # it destroys): a scan that read a meta.json before the teardown
        # removed it must not re-adopt the sandbox once its record left the
        # table. Lists that answer after the destroy never show it again.
        for sb in made:
            tags = [d2.send("list")]
            dt = d2.send("destroy", provider_id=sb.id)
            tags += [d2.send("list") for _ in range(3)]
            self.assertEqual(d2.wait(dt)["status"], "ok")
            after = [d2.send("list") for _ in range(2)]
            for t in tags:
                self.assertEqual(d2.wait(t)["status"], "ok")
            # Lists sent after the destroy answered, and one sent after every
            # overlapping list merged: the destroyed sandbox is gone for good.
            for a in [d2.wait(t) for t in after] + [d2.call("list")]:
                self.assertEqual(a["status"], "ok")
                self.assertNotIn(sb.id, [r["provider_id"] for r in a["resources"]],
                                 "a destroyed sandbox still appeared in list")
        self.assertEqual(d2.call("list")["resources"], [])
        for _ in range(100):
            if not pids_of(list(pids.values())):
                break
            time.sleep(0.1)
        self.assertEqual(pids_of(list(pids.values())), [])
        # No runsc container of ours is left.
        if "gvisor" in classes:
            r = subprocess.run(["runsc", "--root=" + os.path.join(self.state, "runsc"), "list", "-quiet"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.stdout.split(), [])
        self.assertEqual([n for n in os.listdir(self.state) if n.startswith("l")], [])

    def test_private_state_dir_root_is_removed(self):
        # A state dir that sandbox uids cannot traverse (under a 0700
        # directory, as root's $HOME) moves to /run/osr/local-<hash of the
        # state dir>. That root is the provider's alone: it must stay while
        # a sandbox lives in it (a restarted provider finds it there) and be
        # gone once the last sandbox is destroyed and the provider closes,
        # or every such gateway leaves an empty directory behind.
        classes = ["container"] + ([] if runtime_problem("gvisor") else ["gvisor"])
        priv = tempfile.mkdtemp(prefix="osr-private-", dir="/tmp")  # 0700
        sd = os.path.join(priv, "local")
        root = None
        try:
            d = Driver(sd)
            made = [self.create(d, cls=c) for c in classes]
            # <root>/<provider id>/run/agent.sock
            root = os.path.dirname(os.path.dirname(os.path.dirname(made[0].sock)))
            self.assertTrue(root.startswith("/run/osr/local-"), root)
            for sb in made:
                self.assertEqual(sb.sock, os.path.join(root, sb.id, "run", "agent.sock"))
            d.close()  # sandboxes keep running: the root stays
            self.assertEqual(sorted(n for n in os.listdir(root) if n.startswith("l")),
                             sorted(sb.id for sb in made))
            d = Driver(sd)
            self.assertEqual(len(d.call("list")["resources"]), len(made))
            for sb in made:
                self.assertEqual(sb.start("echo still")[1], b"still\n")
                self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")
            d.close()
            self.assertFalse(os.path.exists(root), "empty %s left behind: %r" % (
                root, os.listdir(root) if os.path.isdir(root) else None))
        finally:
            if root is not None and os.path.isdir(root):
                left = [n for n in os.listdir(root) if n.startswith("l")]
                if left:
                    d = Driver(sd)
                    d.call("list")
                    for n in left:
                        d.call("destroy", provider_id=n)
                    d.close()
                shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(priv, ignore_errors=True)


class WarmPool(Base):
    CLASS = "container"

    def wait_warm(self, cls, exclude=(), poll=0.05):
        """The provider id of a ready warm sandbox of `cls` (meta.json says so).
        That is the condition for a create to get it: the adapter takes a warm
        sandbox whose meta.json is still being written and hands it out once
        its pool op is done."""
        for _ in range(int(30 / poll)):
            for n in os.listdir(self.state):
                if n in exclude:
                    continue
                try:
                    with open(os.path.join(self.state, n, "meta.json")) as f:
                        m = json.load(f)
                    if m["warm"] and m["ready"] and m["class"] == cls:
                        return n
                except (OSError, ValueError, KeyError):
                    pass
            time.sleep(poll)
        self.fail("the %s pool never filled" % cls)

    def test_create_as_soon_as_meta_says_ready(self):
        # The create is sent the moment meta.json says ready (polled every
        # millisecond), often while the pool op that wrote it has not
        # finished on the loop: it must get the warm sandbox all the same.
        for _ in range(5):
            d = self.driver(warm_pool={"container": 1})
            warm = self.wait_warm("container", poll=0.001)
            sb = self.create(d)
            self.assertEqual(sb.id, warm, "the create did not get the ready warm sandbox")
            self.assertEqual(sb.start("echo warm")[1], b"warm\n")
            self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")
            d.close()  # destroys the refill
            self.assertEqual([n for n in os.listdir(self.state) if n.startswith("l")], [])

    def run_warm(self, cls):
        d = self.driver(warm_pool={cls: 1})
        warm = self.wait_warm(cls)
        tok = "tok-" + os.urandom(8).hex()
        a = d.call("create", **{"class": cls, "sandbox_id": "w1", "token": tok,
                                "env": {"FOO": "bar baz", "PATH": "/usr/bin:/bin"}})
        self.assertEqual(a["status"], "ok", a)
        # It is the pool's sandbox, handed over with POST /init.
        self.assertEqual(a["resource"]["provider_id"], warm)
        self.assertEqual(a["resource"]["sandbox_id"], "w1")
        sb = Sandbox(a["resource"], tok)
        self.made.append(sb.id)
        code, out, _ = sb.start("echo warm $FOO; id -un; pwd")
        self.assertEqual((code, out), (0, b"warm bar baz\nuser\n/home/user\n"))
        # The pool token no longer works; the meta record carries the label.
        st, _ = Sandbox(a["resource"], "pool-" + warm).unary("process.Process/List", {})
        self.assertEqual(st, 401)
        with open(os.path.join(self.state, warm, "meta.json")) as f:
            m = json.load(f)
        self.assertEqual((m["warm"], m["osr.dev/sandbox-id"]), (False, "w1"))
        # The pool refills in the background with a new sandbox.
        again = self.wait_warm(cls, exclude=(warm,))
        self.assertNotEqual(again, warm)
        # A create without a token is never served from the pool (the warm
        # agent cannot become open again).
        a = d.call("create", **{"class": cls, "sandbox_id": "w2"})
        self.assertEqual(a["status"], "ok", a)
        self.assertNotEqual(a["resource"]["provider_id"], again)
        self.made.append(a["resource"]["provider_id"])
        self.assertEqual(Sandbox(a["resource"], "").start("echo open")[1], b"open\n")
        for pid in (sb.id, a["resource"]["provider_id"]):
            self.assertEqual(d.call("destroy", provider_id=pid)["status"], "ok")
        # Closing the provider destroys the warm one it refilled.
        d.close()
        self.assertFalse(os.path.exists(os.path.join(self.state, again)))

    def test_warm_create_container(self):
        self.run_warm("container")

    def test_warm_create_gvisor(self):
        self.need_class("gvisor")
        self.run_warm("gvisor")

    def burst(self, cls, n, pid1=False):
        """n concurrent creates against a warm pool of 1 (the first takes the
        pool's sandbox, the rest boot cold next to its refill), a command in
        each, then n concurrent destroys: every one must be answered. The
        driver's children must all be reaped in the end (with pid1 nobody
        else would)."""
        d = self.driver(warm_pool={cls: 1}, pid1=pid1)
        warm = self.wait_warm(cls)
        got, errs = [], []

        def one(i):
            try:
                tok = "tok-%d-" % i + os.urandom(4).hex()
                a = d.call("create", **{"class": cls, "sandbox_id": "b%d" % i, "token": tok})
                if a["status"] != "ok":
                    errs.append(a)
                    return
                sb = Sandbox(a["resource"], tok)
                got.append(sb)
                errs.extend([] if sb.start("echo b%d" % i)[1] == b"b%d\n" % i else ["exec %d" % i])
            except Exception as e:  # noqa: BLE001 - reported below
                errs.append(repr(e))

        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.made += [sb.id for sb in got]
        self.assertEqual(errs, [])
        self.assertEqual(len(got), n)
        self.assertIn(warm, [sb.id for sb in got], "no create got the warm sandbox")
        tags = [d.send("destroy", provider_id=sb.id) for sb in got]
        self.assertEqual([d.wait(t)["status"] for t in tags], ["ok"] * n)
        # Every runtime process is gone and reaped: no zombie child is left
        # (bounded wait: the last exits are still being signalled).
        pid = d.pid()
        for _ in range(200):
            if not zombies(pid):
                break
            time.sleep(0.05)
        self.assertEqual(zombies(pid), [], "zombie children of the driver")
        if cls == "gvisor":
            runsc = os.path.join(self.state, "runsc")
            left = [f for f in os.listdir(runsc) if any(sb.id in f for sb in got)] \
                if os.path.isdir(runsc) else []
            self.assertEqual(left, [], "runsc state left behind")

    def test_warm_burst_container(self):
        self.burst("container", 20)

    def test_warm_burst_gvisor_pid1(self):
        # The stall of issue 4: every gVisor destroy waited for PID 1 to reap
        # the sandbox `runsc delete` killed (runsc polls for it 5 s, then
        # gives up); as PID 1 the driver must reap its orphans itself.
        self.need_class("gvisor")
        if not shutil.which("unshare"):
            self.skipTest("no unshare")
        self.burst("gvisor", 8, pid1=True)

    def test_handoff_to_a_wedged_agent_is_answered(self):
        # The warm agent accepts connections but never answers (stopped):
        # POST /init must end at boot_timeout_ms and the create be answered
        # (boot_failed, the pool disables itself), not wait forever.
        d = self.driver(warm_pool={"container": 1}, boot_timeout_ms=1500)
        warm = self.wait_warm("container")
        with open(os.path.join(self.state, warm, "meta.json")) as f:
            uid = json.load(f)["uid"]
        agents = []
        for p in os.listdir("/proc"):
            try:
                if os.stat("/proc/" + p).st_uid == uid and \
                        b"osr-agent" in open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")[0]:
                    agents.append(int(p))
            except (OSError, ValueError):
                pass
        self.assertEqual(len(agents), 1, agents)
        os.kill(agents[0], signal.SIGSTOP)
        a = d.call("create", timeout=60, **{"class": "container", "sandbox_id": "w", "token": "t"})
        self.assertEqual(a["status"], "boot_failed", a)
        self.assertFalse(os.path.exists(os.path.join(self.state, warm)))
        # The pool is off: the next create is cold and works.
        sb = self.create(d)
        self.assertNotEqual(sb.id, warm)
        self.assertEqual(sb.start("echo cold")[1], b"cold\n")
        self.assertEqual(d.call("destroy", provider_id=sb.id)["status"], "ok")

    def test_gvisor_pool_boots_niced(self):
        # A pool sandbox's `runsc run` runs under nice 19 (its gofer and
        # sandbox processes inherit it); a cold one's at the normal 0.
        self.need_class("gvisor")
        if not os.access("/usr/bin/nice", os.X_OK):
            self.skipTest("no /usr/bin/nice")
        d = self.driver(warm_pool={"gvisor": 1})
        warm = self.wait_warm("gvisor")
        a = d.call("create", **{"class": "gvisor", "sandbox_id": "c1"})  # no token: always cold
        self.assertEqual(a["status"], "ok", a)
        cold = a["resource"]["provider_id"]
        self.made.append(cold)

        def nices(pid_dir):
            out = subprocess.run(["ps", "-eo", "ni=,args="], capture_output=True, text=True).stdout
            return sorted({ln.split()[0] for ln in out.splitlines()
                           if "runsc-sandbox" in ln and "/" + pid_dir + " " in ln + " "})
        self.assertEqual(nices(warm), ["19"])
        self.assertEqual(nices(cold), ["0"])
        self.assertEqual(d.call("destroy", provider_id=cold)["status"], "ok")


if __name__ == "__main__":
    osrtest.run()
