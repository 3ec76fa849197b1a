"""The local provider's cgroup v2 path, for real: a VM under qemu (TCG, no
KVM needed) boots Debian's kernel with cgroup2 at /sys/fs/cgroup and this
machine's file system read-only (vm_cgroup2.py), and runs the Guest tests
below inside it, with this build's local_driver and osr-agent creating real
bubblewrap sandboxes through the adapter. The build machine itself mounts
cgroup v1, which test_local.py covers.

  test_cgroup2.py VM      (host, from meson) boot the VM, run the guest
                          tests, fail unless every one of them passed
  test_cgroup2.py Guest   (inside the VM) the tests themselves

Every check reads the kernel's own files from outside the sandbox (the
limit values, memory.events, pids.current, cpu.stat, cgroup.events, which
cgroup each process is in), so a broken v2 path fails here."""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_local  # noqa: E402
import vm_cgroup2  # noqa: E402

CG = "/sys/fs/cgroup"
GUEST_TESTS = ["test_1_limits_written_and_joined", "test_2_memory_hog_oom_killed_and_reported",
               "test_3_fork_bomb_stopped_at_pids_max", "test_4_cpu_max_throttles",
               "test_5_pause_freezes_for_real", "test_6_warm_pool_cpu_weight", "test_7_gvisor",
               "test_8_delegated_parent_and_leaf", "test_9_busy_parent_falls_back",
               "test_9b_explicit_parent"]


def cgfile(sid, name, parent="/osr"):
    with open(CG + parent + "/" + sid + "/" + name) as f:
        return f.read()


def cgwrite(rel, name, value):
    with open(CG + rel + "/" + name, "w") as f:
        f.write(value)


def join(rel):
    """Move the calling process into cgroup `rel` (a preexec_fn)."""
    cgwrite(rel, "cgroup.procs", str(os.getpid()))


def subgroups(rel):
    return [e.name for e in os.scandir(CG + rel) if e.is_dir()]


def asan_build(binary):
    with open(binary, "rb") as f:
        return b"__asan_init" in f.read()


def remove_tree(rel):
    """Remove cgroup `rel` and every group below it, deepest first. Runs
    after the drivers closed and the test's own processes were reaped, so a
    group that still holds a process (rmdir: EBUSY) is a leak: returned for
    the test to report (and moved to the root, so the next test starts
    clean)."""
    left = []
    for dirpath, dirs, _ in sorted(os.walk(CG + rel), key=lambda w: -w[0].count("/")):
        try:
            os.rmdir(dirpath)
        except OSError as e:
            with open(dirpath + "/cgroup.procs") as f:
                pids = f.read().split()
            left.append("%s: %s, holding %s" % (dirpath, e, pids))
            for pid in pids:
                cgwrite("", "cgroup.procs", pid)
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
    return left


def keyed(text, key):
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    raise AssertionError("no %s in %r" % (key, text))


class Guest(test_local.Base):
    """Runs inside the VM (cgroup2 mounted at /sys/fs/cgroup)."""
    CLASS = "container"

    def setUp(self):
        with open("/proc/mounts") as f:
            if not any(l.split()[1:3] == [CG, "cgroup2"] for l in f):
                self.fail("%s is not a cgroup2 mount: not in the VM?" % CG)
        super().setUp()

    def driver_logged(self, **cfg):
        """A driver whose log (stderr) the test can read: returns (driver,
        function returning the log so far)."""
        log = tempfile.NamedTemporaryFile(prefix="osr-driver-", suffix=".log", delete=False)
        d = test_local.Driver(self.state, stderr=log, **cfg)
        self.drivers.append(d)

        def text():
            log.flush()
            with open(log.name, errors="replace") as f:
                return f.read()
        return d, text

    def driver_in(self, rel, **cfg):
        """driver_logged() with the driver started inside cgroup `rel` (the
        child joins before exec, as systemd starts a unit's main process)."""
        real = subprocess.Popen

        def popen(*a, **kw):
            return real(*a, preexec_fn=lambda: join(rel), **kw)
        subprocess.Popen = popen
        try:
            return self.driver_logged(**cfg)
        finally:
            subprocess.Popen = real

    def destroy_gone(self, d, sb, parent="/osr"):
        self.assertEqual(d.call("destroy", provider_id=sb.id, timeout=300)["status"], "ok")
        self.assertFalse(os.path.exists(CG + parent + "/" + sb.id),
                         "the sandbox's cgroup survived destroy")

    def limits_hold(self, d, parent, memory_mib=64):
        """A sandbox under `parent` with its limits written and enforced:
        every process inside, a memory hog OOM-killed there."""
        sb = self.create(d, memory_mib=memory_mib, vcpus=1)
        self.assertEqual(int(cgfile(sb.id, "memory.max", parent)), memory_mib << 20)
        self.assertEqual(cgfile(sb.id, "pids.max", parent).strip(), "64")
        self.assertEqual(cgfile(sb.id, "cpu.max", parent).split(), ["100000", "100000"])
        pids = cgfile(sb.id, "cgroup.procs", parent).split()
        self.assertTrue(pids)
        for p in pids:
            with open("/proc/%s/cgroup" % p) as f:
                self.assertEqual(f.read().strip(), "0::%s/%s" % (parent, sb.id))
        code, _, err = sb.start("python3 -c 'b=[]\nwhile True: b.append(bytearray(8<<20))'",
                                timeout=300)
        self.assertEqual(code, 137, err)
        self.assertGreaterEqual(keyed(cgfile(sb.id, "memory.events", parent), "oom_kill"), 1)
        return sb

    def test_1_limits_written_and_joined(self):
        d, log = self.driver_logged(pids_max=64)
        sb = self.create(d, memory_mib=128, vcpus=1)
        # What the startup log and `osr doctor` say enforces the limits.
        want = ("container limits by cgroup v2: memory memory.max, processes pids.max, "
                "cpu cpu.max, pause cgroup.freeze; sandboxes in /sys/fs/cgroup/osr")
        self.assertIn(want, log())
        cli = os.environ.get("OSR_CLI")
        if cli:
            r = subprocess.run([cli, "doctor", "--data-dir", tempfile.mkdtemp()],
                               capture_output=True, text=True, timeout=300)
            self.assertRegex(r.stdout, r"(?m)^OK\s+provider local .*" + re.escape(want))
        self.assertEqual(int(cgfile(sb.id, "memory.max")), 128 << 20)
        self.assertEqual(cgfile(sb.id, "memory.swap.max").strip(), "0")
        self.assertEqual(cgfile(sb.id, "pids.max").strip(), "64")
        self.assertEqual(cgfile(sb.id, "cpu.max").split(), ["100000", "100000"])
        # The parent enables the controllers and holds no process itself.
        with open(os.path.join(CG, "osr", "cgroup.subtree_control")) as f:
            self.assertTrue({"memory", "pids", "cpu"} <= set(f.read().split()))
        with open(os.path.join(CG, "osr", "cgroup.procs")) as f:
            self.assertEqual(f.read(), "")
        # Every process of the sandbox, the agent included, is in its group,
        # as the sandbox uid (the root step before setpriv is over).
        pids = [int(p) for p in cgfile(sb.id, "cgroup.procs").split()]
        comms = []
        for p in pids:
            with open("/proc/%d/cgroup" % p) as f:
                self.assertEqual(f.read().strip(), "0::/osr/" + sb.id)
            with open("/proc/%d/status" % p) as f:
                st = dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
            self.assertNotEqual(st["Uid"].split()[0], "0", "a sandbox process runs as root")
            comms.append(st["Name"].strip())
        self.assertIn("osr-agent", comms)
        code, out, _ = sb.start("cat /proc/self/cgroup")
        self.assertEqual((code, out), (0, b"0::/\n"))  # its own cgroup namespace
        self.destroy_gone(d, sb)

    def test_2_memory_hog_oom_killed_and_reported(self):
        d, log = self.driver_logged()
        sb = self.create(d, memory_mib=128)
        code, _, err = sb.start("python3 -c 'b=[]\nwhile True: b.append(bytearray(16<<20))'",
                                timeout=300)
        self.assertEqual(code, 137, err)  # SIGKILL from the cgroup's OOM killer
        self.assertGreaterEqual(keyed(cgfile(sb.id, "memory.events"), "oom_kill"), 1)
        self.assertGreaterEqual(int(cgfile(sb.id, "memory.peak")), 120 << 20)
        # The sandbox (and its agent) survive the OOM kill of the hog.
        self.assertEqual(sb.start("echo alive")[1], b"alive\n")
        self.assertEqual(d.call("get", provider_id=sb.id)["status"], "ok")
        self.assertIn("%s (%s): the kernel OOM-killed" % (sb.id, sb.res["sandbox_id"]), log())
        self.destroy_gone(d, sb)

    def test_3_fork_bomb_stopped_at_pids_max(self):
        d = self.driver(pids_max=64)
        sb = self.create(d)
        other = self.create(d)
        sb.start("(f(){ f | f & }; f) >/dev/null 2>&1 & sleep 5; echo done", timeout=300)
        self.assertLessEqual(int(cgfile(sb.id, "pids.current")), 64)
        self.assertGreater(keyed(cgfile(sb.id, "pids.events"), "max"), 0)  # forks were refused
        self.assertEqual(other.start("echo ok")[1], b"ok\n")
        pids = [int(p) for p in cgfile(sb.id, "cgroup.procs").split()]
        self.destroy_gone(d, sb)  # cgroup.kill
        self.assertEqual(test_local.pids_of(pids), [])
        self.destroy_gone(d, other)

    def test_4_cpu_max_throttles(self):
        d = self.driver()
        sb = self.create(d, vcpus=1)
        # Two busy loops (the VM has two CPUs) against a one-CPU quota.
        sb.start("timeout 3 sh -c 'while :; do :; done' & timeout 3 sh -c 'while :; do :; done'; "
                 "wait", timeout=300)
        stat = cgfile(sb.id, "cpu.stat")
        self.assertGreater(keyed(stat, "nr_throttled"), 0, stat)
        self.assertGreater(keyed(stat, "throttled_usec"), 0, stat)
        self.destroy_gone(d, sb)

    def test_5_pause_freezes_for_real(self):
        d = self.driver()
        sb = self.create(d)
        count = os.path.join(self.state, sb.id, "rw", "tmp", "count")

        def counter():
            try:
                sb.start("i=0; while :; do i=$((i+1)); echo $i > /tmp/count; done", timeout=600)
            except Exception:  # the sandbox is destroyed under it
                pass
        threading.Thread(target=counter, daemon=True).start()

        def value():
            try:
                with open(count) as f:
                    return int(f.read() or 0)
            except (OSError, ValueError):
                return 0

        def changes():
            v = value()
            for _ in range(600):
                time.sleep(0.1)
                if value() != v:
                    return True
            return False
        self.assertTrue(changes(), "the counter never ran")
        self.assertEqual(d.call("pause", provider_id=sb.id)["status"], "ok")
        self.assertEqual(cgfile(sb.id, "cgroup.freeze").strip(), "1")
        self.assertEqual(keyed(cgfile(sb.id, "cgroup.events"), "frozen"), 1)
        self.assertEqual(d.call("get", provider_id=sb.id)["resource"]["state"], "paused")
        v = value()
        time.sleep(1.0)  # frozen: no progress at all, however long we look
        self.assertEqual(value(), v, "a paused sandbox kept running")
        a = d.call("resume", provider_id=sb.id)
        self.assertEqual((a["status"], a["resource"]["state"]), ("ok", "running"))
        self.assertEqual(keyed(cgfile(sb.id, "cgroup.events"), "frozen"), 0)
        self.assertTrue(changes(), "the counter did not resume")
        self.destroy_gone(d, sb)

    def test_6_warm_pool_cpu_weight(self):
        d = self.driver(warm_pool={"container": 1})
        warm = test_local.WarmPool.wait_warm(self, "container")
        # cpu.shares 128 of 1024 in v1 terms: cpu.weight 12 of the default 100.
        self.assertEqual(cgfile(warm, "cpu.weight").strip(), "12")
        a = d.call("create", **{"class": "container", "sandbox_id": "w1", "token": "tok-w"})
        self.assertEqual((a["status"], a["resource"]["provider_id"]), ("ok", warm), a)
        self.made.append(warm)
        self.assertEqual(cgfile(warm, "cpu.weight").strip(), "100")  # handed out: full weight
        again = test_local.WarmPool.wait_warm(self, "container", exclude=(warm,))
        self.assertEqual(cgfile(again, "cpu.weight").strip(), "12")
        self.destroy_gone(d, test_local.Sandbox(a["resource"], "tok-w"))
        d.close()  # destroys the refill
        self.assertFalse(os.path.exists(os.path.join(CG, "osr", again)))

    def test_7_gvisor(self):
        why = test_local.runtime_problem("gvisor")
        if why:
            self.skipTest("gvisor class in the VM: %s" % why)
        d = self.driver()
        a = d.call("create", timeout=600, **{"class": "gvisor", "token": "tok-g",
                                            "sandbox_id": "sbx-g", "memory_mib": 256})
        self.assertEqual(a["status"], "ok", a)
        sb = test_local.Sandbox(a["resource"], "tok-g")
        self.made.append(sb.id)
        # runsc made the group from config.json's cgroupsPath under our parent.
        self.assertEqual(int(cgfile(sb.id, "memory.max")), 256 << 20)
        self.assertEqual(cgfile(sb.id, "pids.max").strip(), "512")  # the provider's default
        self.assertEqual(cgfile(sb.id, "cpu.max").split(), ["100000", "100000"])
        self.assertGreater(len(cgfile(sb.id, "cgroup.procs").split()), 0)
        self.assertEqual(sb.start("echo in-gvisor", timeout=300)[1], b"in-gvisor\n")
        # The sentry sizes its memory from that same cgroup limit (no
        # --total-memory flag): the sandbox sees 256 MiB, not the VM's 1 GiB.
        code, out, _ = sb.start("grep MemTotal /proc/meminfo", timeout=300)
        kib = int(out.split()[1])
        self.assertTrue(200 << 10 < kib <= 256 << 10, out)
        self.assertEqual(d.call("pause", provider_id=sb.id, timeout=300)["status"], "ok")
        self.assertEqual(d.call("resume", provider_id=sb.id, timeout=300)["status"], "ok")
        self.assertEqual(sb.start("echo back", timeout=300)[1], b"back\n")
        self.destroy_gone(d, sb)

    def test_8_delegated_parent_and_leaf(self):
        # What systemd does for a Delegate=yes unit: the unit's group, with
        # the controllers enabled on the way down, and the main process in it.
        svc = "/test.slice/osr.service"
        self.addCleanup(lambda: self.assertEqual(remove_tree("/test.slice"), []))
        os.makedirs(CG + svc)
        cgwrite("/test.slice", "cgroup.subtree_control", "+memory +pids +cpu")
        # systemd's delegate mark, and a second process of the unit (a
        # wrapper): with the mark both are the service's, and both move.
        os.setxattr(CG + svc, "trusted.delegate", b"1")
        wrapper = subprocess.Popen(["sleep", "600"], preexec_fn=lambda: join(svc))
        self.addCleanup(lambda: (wrapper.kill(), wrapper.wait()))
        d, log = self.driver_in(svc, pids_max=64)
        sb = self.limits_hold(d, svc + "/sandboxes")
        self.assertIn("sandboxes in /sys/fs/cgroup%s/sandboxes; delegated cgroup %s, this "
                      "process in %s/gateway" % (svc, svc, svc), log())
        # The driver left the unit's group for the leaf, which the kernel
        # requires before the group can enable controllers for sandboxes/.
        with open("/proc/%d/cgroup" % d.p.pid) as f:
            self.assertEqual(f.read().strip(), "0::%s/gateway" % svc)
        with open(CG + svc + "/cgroup.procs") as f:
            self.assertEqual(f.read(), "")
        with open(CG + svc + "/gateway/cgroup.procs") as f:
            self.assertEqual(sorted(int(p) for p in f.read().split()),
                             sorted([d.p.pid, wrapper.pid]))
        self.assertTrue({"memory", "pids", "cpu"} <=
                        set(open(CG + svc + "/cgroup.subtree_control").read().split()))
        self.assertFalse(os.path.exists(CG + "/osr/" + sb.id))
        self.destroy_gone(d, sb, svc + "/sandboxes")
        d.close()
        self.assertEqual(subgroups(svc + "/sandboxes"), [])
        # A group holding processes not ours (a login scope) is not taken:
        # the sandboxes go to /osr, and the log says why.
        os.makedirs(CG + "/test.slice/other")
        shell = subprocess.Popen(["sleep", "600"], preexec_fn=lambda: join("/test.slice/other"))
        self.addCleanup(lambda: (shell.kill(), shell.wait()))
        d2, log2 = self.driver_in("/test.slice/other")
        sb2 = self.create(d2)
        self.assertTrue(os.path.exists(CG + "/osr/" + sb2.id))
        self.assertIn("sandboxes in /sys/fs/cgroup/osr; own cgroup /test.slice/other is not "
                      "delegated (1 other process(es), no delegate mark)", log2())
        self.destroy_gone(d2, sb2)
        d2.close()

    def test_9_busy_parent_falls_back(self):
        # A process in the would-be parent's parent: the kernel refuses
        # controllers there (EBUSY), so no sandbox can get v2 limits under
        # it. The adapter says so at start (log, doctor) and enforces the
        # rlimits instead; it does not advertise pause.
        self.addCleanup(lambda: self.assertEqual(remove_tree("/busy.slice"), []))
        os.makedirs(CG + "/busy.slice")
        squatter = subprocess.Popen(["sleep", "600"], preexec_fn=lambda: join("/busy.slice"))
        self.addCleanup(lambda: (squatter.kill(), squatter.wait()))
        reason = ("cgroup_parent /busy.slice/sandboxes; /busy.slice holds processes, so the "
                  "kernel refuses controllers in its cgroup.subtree_control (no internal "
                  "processes)")
        d, log = self.driver_logged(cgroup_parent="/busy.slice/sandboxes", pids_max=64)
        # The manifest claims neither pause nor the gvisor class (whose
        # runsc would need the same controllers).
        info = d.call("describe")
        self.assertEqual((info["status"], info["pause"]), ("ok", False), info)
        self.assertEqual(info["classes"], ["container"])
        self.assertIn("container limits by no usable cgroup: memory rlimit (prlimit --as), "
                      "processes rlimit (prlimit --nproc, per uid), cpu not limited, pause "
                      "unavailable; " + reason, log())
        cli = os.environ.get("OSR_CLI")
        if cli:
            env = dict(os.environ, OSR_LOCAL_CGROUP_PARENT="/busy.slice/sandboxes")
            r = subprocess.run([cli, "doctor", "--data-dir", tempfile.mkdtemp()], env=env,
                               capture_output=True, text=True, timeout=300)
            self.assertIn("container limits by rlimits, not cgroup v2: " + reason, r.stdout)
        self.assertFalse(os.path.exists(CG + "/busy.slice/sandboxes"))
        if asan_build(test_local.AGENT):
            # An ASan agent cannot start under an address-space rlimit (its
            # shadow memory alone is terabytes of it): the create part runs
            # with a release build only (docs/development.md).
            sys.stderr.write("test_9: ASan build, the rlimit create is not run\n")
            return
        sb = self.create(d, memory_mib=128)
        code, out, _ = sb.start("grep -E 'Max (address space|processes)' /proc/self/limits")
        self.assertEqual(code, 0)
        self.assertRegex(out.decode(), r"Max address space\s+%d\s+%d" % (128 << 20, 128 << 20))
        self.assertRegex(out.decode(), r"Max processes\s+64\s+64")
        self.assertNotEqual(d.call("pause", provider_id=sb.id)["status"], "ok")
        self.destroy_gone(d, sb)

    def test_9b_explicit_parent(self):
        parent = "/custom.slice/osr-sandboxes"
        self.addCleanup(lambda: self.assertEqual(remove_tree("/custom.slice"), []))
        d, log = self.driver_logged(cgroup_parent=parent, pids_max=64)
        sb = self.limits_hold(d, parent)
        self.assertIn("sandboxes in /sys/fs/cgroup%s; cgroup_parent %s" % (parent, parent), log())
        self.destroy_gone(d, sb, parent)
        d.close()
        self.assertEqual(subgroups(parent), [])
        bad, badlog = self.driver_logged(cgroup_parent="/../etc")
        self.assertNotEqual(bad.p.wait(timeout=60), 0)
        self.assertIn("key 'cgroup_parent': '/../etc' is not a cgroup path", badlog())


class VM(unittest.TestCase):
    """Runs on the host: boot the VM, run Guest inside, check its results."""

    def test_cgroup2_in_vm(self):
        why = vm_cgroup2.problem()
        if why:
            self.skipTest(why)
        env = {k: v for k, v in os.environ.items()
               if k.startswith(("OSR_", "ASAN_", "UBSAN_", "LSAN_", "MESON_"))}
        script = "".join("export %s='%s'\n" % (k, v.replace("'", "'\\''")) for k, v in env.items())
        script += "cd '%s' && exec '%s' '%s' Guest -v\n" % (
            HERE, os.path.realpath(sys.executable), os.path.join(HERE, "test_cgroup2.py"))
        t0 = time.time()
        status, output, console, files = vm_cgroup2.run(script, timeout_s=900)
        sys.stderr.write("VM run: %.0f s\n--- guest output ---\n%s\n" % (time.time() - t0, output))
        results = json.loads(files.get("results.json", b"{}") or b"{}")
        if status is None:
            sys.stderr.write("--- console ---\n%s\n" % console[-4000:])
        self.assertIsNotNone(status, "the VM did not finish the guest tests")
        failed = {n: r for n, r in results.items() if r not in ("ok", "skipped")}
        self.assertEqual(failed, {})
        for name in GUEST_TESTS:
            self.assertIn(name, results, "guest test %s did not run" % name)
        # Only gVisor may be skipped (runsc not installed or not runnable in
        # the VM), and its reason is in the output above.
        skipped = [n for n, r in results.items() if r == "skipped"]
        self.assertLessEqual(set(skipped), {"test_7_gvisor"})
        self.assertEqual(status, 0)


class _Record(unittest.TextTestResult):
    outcomes = {}

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes[test._testMethodName] = "ok"

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[test._testMethodName] = "failed"

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[test._testMethodName] = "error"

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes[test._testMethodName] = "skipped"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "Guest":
        os.environ.setdefault("OSR_LOG_LEVEL", "info")
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Guest)
        # Fail fast: the tests run in their numbered order, the limits first,
        # and a fork bomb or a memory hog without working limits would take
        # the whole VM down until qemu's timeout.
        r = unittest.TextTestRunner(verbosity=2, resultclass=_Record, failfast=True).run(suite)
        out = os.environ.get("OSR_VM_OUT")
        if out:
            with open(os.path.join(out, "results.json"), "w") as f:
                json.dump(_Record.outcomes, f)
        sys.exit(0 if r.wasSuccessful() else 1)
    unittest.main()
